"""Iteration-level scheduler over the page allocator. Plain Python: never imports jax.

Each step: running sequences first (decodes, then unfinished prefill chunks), FCFS; then new
sequences are admitted while slots, the token budget and pages last. A prompt longer than the
budget is prefilled in chunks, so no step stalls the running decodes by more than one budget.
When pages run out, the newest running sequence is preempted (its pages freed, recomputed later).
The scheduling policy (``policy.py``) sets the orders: ``fcfs`` as above, or ``priority``, where
the queue and the running sequences go by (priority, arrival), the one served last is the one
preempted, and a waiting sequence of a higher priority preempts a running one for its slot or
pages.
LongRoPE models (Phi-3) rotate a sequence longer than their original context with other factors:
a sequence that grows past it is recomputed in place, as transformers' generation does. When
every layer attends within a sliding window (Mistral), pages that left every query's window are
freed as sequences advance.
The batch policy turns the same machinery into the simpler strategies: ``static``/``dynamic``/
``none`` admit a new batch only when the previous one has finished.
"""

from __future__ import annotations

import collections
import dataclasses
import time

from jaxgen.engine.scheduling.page_allocator import SCRATCH_PAGE
from jaxgen.engine.scheduling.policy import scheduling_policy
from jaxgen.engine.scheduling.sequence import Sequence, SequenceStatus


@dataclasses.dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """Scheduling limits and the batching policy."""

    max_num_seqs: int  # max_rolling_batch_size (or batch_size for batch-at-a-time policies)
    max_num_batched_tokens: int  # max_rolling_batch_prefill_tokens: token budget per step
    max_model_len: int
    batch_at_a_time: bool = False  # static / dynamic / none: admit only into an empty engine
    max_batch_delay: float = 0.0  # dynamic: wait this long for a full batch
    # LongRoPE's original context: a longer sequence uses the long factors for all its keys.
    long_rope_threshold: int | None = None
    # Every layer's sliding window (None: some layer attends to every earlier token).
    sliding_window: int | None = None
    # Distinct LoRA adapters that may run at once (their device slots; 0: the engine has none).
    max_loras: int = 0
    policy: str = "fcfs"  # the scheduling policy (``policy.SCHEDULING_POLICIES``)


@dataclasses.dataclass
class ScheduledSequence:
    seq: Sequence
    num_new_tokens: int  # tokens computed for it this step (1 for a decode)

    @property
    def is_decode(self) -> bool:
        return (
            self.seq.num_computed_tokens >= self.seq.num_prompt_tokens
            and self.num_new_tokens == 1
            and self.seq.num_uncomputed_tokens == 1
        )

    @property
    def completes(self) -> bool:
        """Whether this step reaches the sequence's last token (so its sample is kept)."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclasses.dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSequence]
    preempted: list[Sequence]

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """Waiting and running queues, admission, chunked prefill and preemption by recompute."""

    def __init__(self, config: SchedulerConfig, allocator):
        self.config = config
        self.allocator = allocator
        self.policy = scheduling_policy(config.policy)
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.num_rope_recomputes = 0  # sequences recomputed on crossing LongRoPE's threshold
        self.kv_tokens_peak = 0
        self.kv_pages_peak = 0

    # -- queue management ------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        if seq.num_prompt_tokens + 1 > self.config.max_model_len:
            raise ValueError(
                f"prompt of {seq.num_prompt_tokens} tokens leaves no room to generate within "
                f"max_model_len={self.config.max_model_len}"
            )
        if self.allocator.pages_needed(self.config.max_model_len) > self.allocator.num_usable_pages:
            raise ValueError("the KV pool cannot hold one sequence of max_model_len tokens")
        seq.status = SequenceStatus.WAITING
        self.policy.queue(self.waiting, seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Marks ``seq`` finished and frees its pages (works from either queue)."""
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.allocator.free(seq)

    # -- scheduling --------------------------------------------------------------------------
    def schedule(self, now: float | None = None) -> SchedulerOutput:
        """Chooses the sequences and token counts of the next step."""
        now = time.monotonic() if now is None else now
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledSequence] = []
        preempted: list[Sequence] = []

        # Running sequences in the policy's order (fcfs: oldest first); decodes before
        # unfinished prefills so they never wait.
        for seq in self.policy.running_order(self.running):
            if budget <= 0:
                break
            if seq not in self.running:  # preempted below to make room for an earlier one
                continue
            num_new = min(seq.num_uncomputed_tokens, budget)
            while not self.allocator.allocate(seq, seq.num_computed_tokens + num_new):
                victim = self.policy.victim(self.running)
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                scheduled.append(ScheduledSequence(seq, num_new))
                budget -= num_new
        scheduled = [s for s in scheduled if s.seq.status == SequenceStatus.RUNNING]
        if self._may_admit(now):
            scheduled = self._admit(now, scheduled, preempted)
        self._track_peak(scheduled)
        return SchedulerOutput(scheduled, preempted)

    def _admit(
        self, now: float, scheduled: list[ScheduledSequence], preempted: list[Sequence]
    ) -> list[ScheduledSequence]:
        """Admits waiting sequences, first in the queue first, while slots, the token budget
        and pages last; under the priority policy one that finds no slot or pages preempts a
        running sequence of a lower priority for them (``policy.displaced_by``). Returns the
        step's sequences, the preempted ones taken out."""
        budget = self.config.max_num_batched_tokens - sum(s.num_new_tokens for s in scheduled)
        skipped: list[Sequence] = []
        displaced: list[Sequence] = []
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            if seq in displaced:  # preempted for a waiting one this step: not back at once
                break
            if len(self.running) >= self.config.max_num_seqs:
                victim = self.policy.displaced_by(seq, self.running)
                if victim is None:
                    break
                budget += self._displace(victim, scheduled, displaced)
                continue
            # n > 1: wait for the sibling's prompt to share its pages; not under a batch policy,
            # where waiting would push this sample into the next batch.
            if (
                seq.depends_on is not None
                and not self.config.batch_at_a_time
                and not self._prefix_ready(seq.depends_on)
            ):
                skipped.append(self.waiting.popleft())
                continue
            if not self._adapter_fits(seq):  # waits for a LoRA slot; others go on
                skipped.append(self.waiting.popleft())
                continue
            if not seq.block_table:
                seq.long_rope = self._wants_long_rope(seq)
                if not seq.wants_prompt_logprobs:  # those compute every position
                    seq.num_computed_tokens = self.allocator.match_prefix(seq)
                    seq.num_cached_tokens = seq.num_computed_tokens
            num_new = min(seq.num_uncomputed_tokens, budget)
            while not self.allocator.allocate(seq, seq.num_computed_tokens + num_new):
                victim = self.policy.displaced_by(seq, self.running)
                if victim is None:
                    break
                budget += self._displace(victim, scheduled, displaced)
            else:
                self.waiting.popleft()
                seq.status = SequenceStatus.RUNNING
                if seq.first_scheduled_time is None:
                    seq.first_scheduled_time = now
                self.running.append(seq)
                scheduled.append(ScheduledSequence(seq, num_new))
                budget -= num_new
                continue
            if not self.running and not scheduled:
                raise RuntimeError("KV pool too small for a single sequence")
            self.allocator.free(seq)
            seq.num_computed_tokens = 0
            break
        self.waiting.extendleft(reversed(skipped))
        preempted.extend(displaced)
        return [s for s in scheduled if s.seq.status == SequenceStatus.RUNNING]

    def _displace(
        self, victim: Sequence, scheduled: list[ScheduledSequence], displaced: list[Sequence]
    ) -> int:
        """Preempts ``victim`` for a waiting sequence of a higher priority; returns the tokens
        of this step's budget it held."""
        self._preempt(victim)
        displaced.append(victim)
        return sum(s.num_new_tokens for s in scheduled if s.seq is victim)

    def _may_admit(self, now: float) -> bool:
        cfg = self.config
        if not cfg.batch_at_a_time:
            return True
        if self.running:
            return False
        if len(self.waiting) >= cfg.max_num_seqs or not self.waiting:
            return True
        return now - self.waiting[0].arrival_time >= cfg.max_batch_delay

    def _adapter_fits(self, seq: Sequence) -> bool:
        """Whether ``seq``'s LoRA adapter may run beside the running sequences': at most
        ``max_loras`` distinct adapters run at once (each holds a device slot)."""
        if not seq.lora_int_id:
            return True
        running = {other.lora_int_id for other in self.running if other.lora_int_id}
        return seq.lora_int_id in running or len(running) < self.config.max_loras

    def _prefix_ready(self, sibling: Sequence) -> bool:
        return sibling.is_finished or sibling.num_computed_tokens >= sibling.num_prompt_tokens - 1

    def _wants_long_rope(self, seq: Sequence) -> bool:
        threshold = self.config.long_rope_threshold
        return threshold is not None and seq.num_tokens > threshold

    def _recompute_with_long_rope(self, seq: Sequence) -> None:
        """A sequence that just grew past LongRoPE's threshold: its cached keys were rotated
        with the short factors, so it drops its pages and computes every token again (as one
        prefill, chunked like any other) with the long ones. It stays running."""
        self.allocator.free(seq)
        seq.num_computed_tokens = 0
        seq.num_cached_tokens = 0
        seq.long_rope = True
        self.num_rope_recomputes += 1

    def _preempt(self, seq: Sequence) -> None:
        self._requeue(seq)
        seq.num_preemptions += 1
        self.num_preemptions += 1

    def _requeue(self, seq: Sequence) -> None:
        """Frees ``seq``'s pages and puts it back in the queue (fcfs: first), to recompute from
        its tokens."""
        self.running.remove(seq)
        self.allocator.free(seq)
        seq.num_computed_tokens = 0
        seq.num_cached_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.policy.requeue(self.waiting, seq)

    def requeue_all(self) -> list[Sequence]:
        """Sends every running sequence back to the queue to be recomputed from its tokens (the
        KV pool lost their pages' contents); the oldest stays first. Returns them."""
        requeued = list(self.running)
        for seq in reversed(requeued):
            self._requeue(seq)
        return requeued

    def _track_peak(self, scheduled: list[ScheduledSequence]) -> None:
        used = self.allocator.num_used_pages
        if used > self.kv_pages_peak:
            self.kv_pages_peak = used
            self.kv_tokens_peak = self.cached_tokens(
                {s.seq.seq_id: s.num_new_tokens for s in scheduled}
            )

    def cached_tokens(self, new_tokens: dict[int, int] | None = None) -> int:
        """Distinct tokens whose K/V occupy pages of running sequences once this step has run."""
        new_tokens = new_tokens or {}
        page_size = self.allocator.page_size
        fill: dict[int, int] = {}
        for seq in self.running:
            tokens = seq.num_computed_tokens + new_tokens.get(seq.seq_id, 0)
            for i, page in enumerate(seq.block_table):
                if page == SCRATCH_PAGE:  # released: out of the sliding window
                    continue
                fill[page] = max(fill.get(page, 0), min(page_size, max(0, tokens - i * page_size)))
        return sum(fill.values())

    def postprocess(self, output: SchedulerOutput, sampled: dict[int, int]) -> list[Sequence]:
        """Advances computed counts and appends sampled tokens; returns sequences that got a token.

        ``sampled`` maps seq_id to the sampled token for sequences whose step completed them.
        """
        got_token = []
        for item in output.scheduled:
            seq = item.seq
            seq.num_computed_tokens += item.num_new_tokens
            if seq.num_computed_tokens == seq.num_tokens and seq.seq_id in sampled:
                seq.output_token_ids.append(sampled[seq.seq_id])
                got_token.append(seq)
            self.allocator.register_full_pages(seq)
            if self.config.sliding_window is not None:
                # The next query (position num_computed_tokens) reads keys from here on.
                first_read = seq.num_computed_tokens - self.config.sliding_window + 1
                self.allocator.free_before(seq, first_read)
            if not seq.long_rope and self._wants_long_rope(seq):
                self._recompute_with_long_rope(seq)
        return got_token
