"""The scheduler tests' fake engine: a real scheduler and allocator, a fake runner (no jax).

``FakeEngine`` mirrors ``LLMEngine.step``: schedule -> "run" -> postprocess -> finish. Its runner
writes, for every computed position, the position's causal prefix into a fake KV pool (what real
K/V depends on), and samples each new token from the context it reads back through the block
table. So a wrongly shared, overwritten or lost page changes the generated tokens, and the
expected tokens of every request can be computed without any engine: ``reference_tokens``.
"""

from __future__ import annotations

import collections
import dataclasses

from jaxgen.engine.scheduling.contiguous_allocator import ContiguousAllocator
from jaxgen.engine.scheduling.page_allocator import SCRATCH_PAGE, PageAllocator
from jaxgen.engine.scheduling.policy import priority_key
from jaxgen.engine.scheduling.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from jaxgen.engine.scheduling.sequence import Sequence, SequenceStatus


def fake_token(index: int, context: list[int] | tuple[int, ...]) -> int:
    """The deterministic "sample" of sequence ``index`` of a request after ``context``."""
    return hash((index, tuple(context))) % 1000


def reference_tokens(prompt: list[int], max_tokens: int, index: int = 0) -> list[int]:
    tokens: list[int] = []
    for _ in range(max_tokens):
        tokens.append(fake_token(index, prompt + tokens))
    return tokens


@dataclasses.dataclass
class Req:
    request_id: str
    prompt: list[int]
    max_tokens: int
    seqs: list[Sequence]
    aborted: bool = False


class FakeEngine:
    """The engine's step loop over a real scheduler and allocator, with a fake model runner."""

    def __init__(
        self,
        *,
        num_pages: int = 64,
        page_size: int = 4,
        max_num_seqs: int = 4,
        max_num_batched_tokens: int = 64,
        max_model_len: int = 32,
        batch_at_a_time: bool = False,
        max_batch_delay: float = 0.0,
        enable_prefix_caching: bool = True,
        contiguous: bool = False,
        scheduling_policy: str = "fcfs",
    ):
        if contiguous:
            allocator = ContiguousAllocator(max_num_seqs, max_model_len, page_size)
        else:
            allocator = PageAllocator(
                num_pages, page_size, enable_prefix_caching=enable_prefix_caching
            )
        self.allocator = allocator
        self.paged = not contiguous
        self.config = SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            batch_at_a_time=batch_at_a_time,
            max_batch_delay=max_batch_delay,
            policy=scheduling_policy,
        )
        self.scheduler = Scheduler(self.config, allocator)
        self.kv: dict[int, list[tuple[int, ...] | None]] = {}
        self.requests: dict[str, Req] = {}
        self.history: list[SchedulerOutput] = []
        self.now = 0.0
        self.num_steps = 0
        self.num_prefill_chunks = 0  # scheduled prompt pieces shorter than what was left

    # -- requests -------------------------------------------------------------------------------
    def add(
        self,
        request_id: str,
        prompt: list[int],
        max_tokens: int,
        *,
        n: int = 1,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> Req:
        """As ``Request``: n sequences, siblings depend on the first, max_tokens fits the model."""
        arrival = self.now if arrival_time is None else arrival_time
        max_tokens = min(max_tokens, self.config.max_model_len - len(prompt))
        seqs: list[Sequence] = []
        for i in range(n):
            seqs.append(
                Sequence(
                    prompt,
                    max_tokens=max_tokens,
                    request_id=request_id,
                    index=i,
                    arrival_time=arrival,
                    depends_on=seqs[0] if i else None,
                    priority=priority,
                )
            )
        for seq in seqs:
            self.scheduler.add(seq)
        req = Req(request_id, list(prompt), max_tokens, seqs)
        self.requests[request_id] = req
        return req

    def abort(self, request_id: str) -> None:
        req = self.requests[request_id]
        req.aborted = True
        for seq in req.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")

    def all_seqs(self) -> list[Sequence]:
        return [seq for req in self.requests.values() for seq in req.seqs]

    # -- the step -------------------------------------------------------------------------------
    def step(self, now: float | None = None) -> SchedulerOutput:
        now = self.now if now is None else now
        before_running = list(self.scheduler.running)
        before_uncomputed = {seq.seq_id: seq.num_uncomputed_tokens for seq in before_running}
        out = self.scheduler.schedule(now=now)
        self.check_schedule(out, before_running, before_uncomputed)
        sampled = self.run_model(out)
        if not out.is_empty:
            self.num_steps += 1
            self.history.append(out)
        for seq in self.scheduler.postprocess(out, sampled):
            if seq.num_generated >= seq.max_tokens or seq.num_tokens >= self.config.max_model_len:
                self.scheduler.finish(seq, "length")
        self.check_invariants()
        return out

    def run_model(self, out: SchedulerOutput) -> dict[int, int]:
        ps = self.allocator.page_size
        for item in out.scheduled:  # write every scheduled position first, as one batch does
            seq = item.seq
            for pos in range(
                seq.num_computed_tokens, seq.num_computed_tokens + item.num_new_tokens
            ):
                page = seq.block_table[pos // ps]
                assert page != SCRATCH_PAGE
                if self.paged:
                    assert self.allocator.ref_counts[page] == 1, "wrote into a shared page"
                    assert page not in self.allocator.page_hash, "wrote into a cached page"
                self.kv.setdefault(page, [None] * ps)[pos % ps] = tuple(seq.token_ids[: pos + 1])
        sampled = {}
        for item in out.scheduled:
            if item.completes:
                seq = item.seq
                context = [self.kv[seq.block_table[p // ps]][p % ps] for p in range(seq.num_tokens)]
                assert context == [tuple(seq.token_ids[: p + 1]) for p in range(seq.num_tokens)]
                sampled[seq.seq_id] = fake_token(seq.index, seq.token_ids)
        return sampled

    def run(self, max_steps: int = 5_000, dt: float = 0.0) -> int:
        """Steps until every request finished; every step must do work (no stall, no deadlock)."""
        steps = 0
        while self.scheduler.has_unfinished():
            assert steps < max_steps, f"no progress after {steps} steps: {self.scheduler.running}"
            self.now += dt
            out = self.step()
            assert not out.is_empty, "an idle step with unfinished requests: a deadlock"
            steps += 1
        return steps

    # -- checks ---------------------------------------------------------------------------------
    def check_schedule(self, out, before_running, before_uncomputed) -> None:
        cfg = self.config
        items = out.scheduled
        seqs = [item.seq for item in items]
        assert len(seqs) == len(set(map(id, seqs))), "a sequence scheduled twice"
        assert out.num_tokens <= cfg.max_num_batched_tokens, "token budget exceeded"
        assert len(items) <= cfg.max_num_seqs
        assert len(self.scheduler.running) <= cfg.max_num_seqs
        ps = self.allocator.page_size
        for item in items:
            seq = item.seq
            assert seq.status == SequenceStatus.RUNNING and seq in self.scheduler.running
            assert 1 <= item.num_new_tokens <= seq.num_uncomputed_tokens
            assert len(seq.block_table) * ps >= seq.num_computed_tokens + item.num_new_tokens
            if item.num_new_tokens < seq.num_uncomputed_tokens:
                self.num_prefill_chunks += 1
        for seq in out.preempted:
            assert seq.num_computed_tokens == 0 or seq in self.scheduler.running
        # Sequences that were running go first, decodes before prefill chunks; then admissions.
        order = {seq.seq_id: i for i, seq in enumerate(before_running)}
        kinds = []
        for item in items:
            if item.seq.seq_id in order and item.seq not in out.preempted:
                kinds.append(0 if before_uncomputed[item.seq.seq_id] == 1 else 1)
            else:
                kinds.append(2)
        assert kinds == sorted(kinds), f"decodes, then prefill chunks, then admissions: {kinds}"
        # Preemption takes the running sequences served last (fcfs: the newest; priority: the
        # highest priority number, then the latest arrival): every survivor comes before a victim.
        keys = {seq.seq_id: priority_key(seq) for seq in before_running}
        rank = order.get if cfg.policy == "fcfs" else keys.get
        victims = [rank(seq.seq_id) for seq in out.preempted if seq.seq_id in order]
        survivors = [rank(s.seq_id) for s in before_running if s not in out.preempted]
        if victims and survivors:
            assert max(survivors) < min(victims), "preempted a sequence served before another"
        # With budget for every running sequence, no running decode waits (unless preempted).
        if cfg.max_num_batched_tokens >= cfg.max_num_seqs:
            for seq in before_running:
                if before_uncomputed[seq.seq_id] == 1 and seq not in out.preempted:
                    assert seq in seqs, "a running decode was left out of the step"

    def check_invariants(self) -> None:
        sched, alloc = self.scheduler, self.allocator
        running, waiting = sched.running, list(sched.waiting)
        assert len(running) == len(set(map(id, running)))
        assert len(waiting) == len(set(map(id, waiting)))
        assert not set(map(id, running)) & set(map(id, waiting)), "both waiting and running"
        assert len(running) <= self.config.max_num_seqs
        for seq in running:
            assert seq.status == SequenceStatus.RUNNING
            assert len(seq.block_table) * alloc.page_size >= seq.num_computed_tokens
        for seq in waiting:
            assert seq.status == SequenceStatus.WAITING
            assert seq.block_table == [], "a waiting sequence holds pages"
        queued = set(map(id, running)) | set(map(id, waiting))
        for seq in self.all_seqs():
            if seq.is_finished:
                assert id(seq) not in queued and seq.block_table == []
                assert seq.finish_reason in ("length", "abort")
            else:
                assert id(seq) in queued, "a sequence was lost"
        assert alloc.num_free_pages + alloc.num_used_pages == alloc.num_usable_pages
        assert sched.kv_pages_peak >= alloc.num_used_pages
        if self.paged:
            counts = collections.Counter(p for seq in running for p in seq.block_table)
            assert SCRATCH_PAGE not in counts and SCRATCH_PAGE not in alloc.free_pages
            for page in range(1, alloc.num_pages):
                assert alloc.ref_counts[page] == counts.get(page, 0), f"page {page} leaked"
                assert (page in alloc.free_pages) == (counts.get(page, 0) == 0)
            assert alloc.num_used_pages == len(counts)
        else:
            assert sorted(alloc.slot_of) == sorted(s.seq_id for s in running if s.block_table)
            assert alloc.num_used_pages == len(alloc.slot_of) * alloc.pages_per_slot

    def check_outputs(self) -> None:
        """Every request that was not aborted generated exactly its reference tokens."""
        for req in self.requests.values():
            for seq in req.seqs:
                assert seq.is_finished
                if seq.finish_reason == "length":
                    expected = reference_tokens(req.prompt, req.max_tokens, seq.index)
                    assert seq.output_token_ids == expected, f"request {req.request_id}"
                else:
                    assert req.aborted
                    ref = reference_tokens(req.prompt, seq.num_generated, seq.index)
                    assert seq.output_token_ids == ref

    def outputs(self) -> dict[str, list[list[int]]]:
        return {rid: [s.output_token_ids for s in r.seqs] for rid, r in self.requests.items()}


def prompt_of(seed: int, length: int) -> list[int]:
    return [(seed * 31 + i * 7) % 50 for i in range(length)]


SHARED_PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4]


WORKLOAD = [  # (prompt seed, prompt length, max_tokens)
    (1, 5, 6),
    (2, 17, 3),
    (3, 1, 9),
    (4, 11, 11),
    (1, 9, 4),
    (5, 23, 2),
    (6, 3, 14),
    (7, 14, 7),
]


def run_workload(**engine_kwargs) -> FakeEngine:
    engine = FakeEngine(**engine_kwargs)
    for i, (seed, length, max_tokens) in enumerate(WORKLOAD):
        engine.add(f"r{i}", prompt_of(seed, length), max_tokens)
    engine.run()
    engine.check_outputs()
    return engine
