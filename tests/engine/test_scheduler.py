"""Tests for jaxgen.engine.scheduler, driven by a fake runner (plain Python, no jax).

``FakeEngine`` mirrors ``LLMEngine.step``: schedule -> "run" -> postprocess -> finish. Its runner
writes, for every computed position, the position's causal prefix into a fake KV pool (what real
K/V depends on), and samples each new token from the context it reads back through the block
table. So a wrongly shared, overwritten or lost page changes the generated tokens, and the
expected tokens of every request can be computed without any engine: ``reference_tokens``.
"""

from __future__ import annotations

import collections
import dataclasses

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from jaxgen.engine.page_allocator import SCRATCH_PAGE, ContiguousAllocator, PageAllocator
from jaxgen.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from jaxgen.engine.sequence import Sequence, SequenceStatus


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
        # Preemption takes the newest running sequences: every survivor is older than a victim.
        victims = [order[seq.seq_id] for seq in out.preempted if seq.seq_id in order]
        survivors = [order[s.seq_id] for s in before_running if s not in out.preempted]
        if victims and survivors:
            assert max(survivors) < min(victims), "preempted an older sequence before a newer one"
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


# -- step composition -----------------------------------------------------------------------------


def test_running_decodes_are_scheduled_before_prefill_chunks_and_admissions():
    engine = FakeEngine(max_num_batched_tokens=8, max_num_seqs=4)
    a = engine.add("a", prompt_of(3, 1), 5).seqs[0]
    b = engine.add("b", prompt_of(2, 30), 5).seqs[0]
    first = engine.step()
    assert [(s.seq, s.num_new_tokens) for s in first.scheduled] == [(a, 1), (b, 7)]
    c = engine.add("c", prompt_of(4, 2), 5).seqs[0]
    # Make b the oldest running sequence: its prefill chunk must still wait for a's decode.
    engine.scheduler.running[:] = [b, a]
    second = engine.step()
    assert [(s.seq, s.num_new_tokens) for s in second.scheduled] == [(a, 1), (b, 7)]
    assert second.scheduled[0].is_decode
    assert not second.scheduled[1].is_decode and not second.scheduled[1].completes
    assert c.status == SequenceStatus.WAITING, "no budget left for admissions"
    while b.num_uncomputed_tokens > 1:
        engine.step()
    out = engine.step()  # b's last prompt chunk leaves budget for c
    assert [s.seq for s in out.scheduled][-1] is c
    engine.run()
    engine.check_outputs()


def test_token_budget_and_max_num_seqs_are_never_exceeded():
    engine = run_workload(max_num_batched_tokens=6, max_num_seqs=3)
    assert max(out.num_tokens for out in engine.history) == 6
    assert max(len(out.scheduled) for out in engine.history) == 3


def test_chunked_prefill_with_a_tiny_budget_generates_the_same_tokens_as_a_big_budget():
    big = run_workload(max_num_batched_tokens=256, max_num_seqs=8)
    tiny = run_workload(max_num_batched_tokens=2, max_num_seqs=2)
    assert big.num_prefill_chunks == 0
    assert tiny.num_prefill_chunks > 0
    assert tiny.outputs() == big.outputs()
    assert tiny.num_steps > big.num_steps


def test_long_prompt_is_prefilled_in_budget_sized_chunks():
    engine = FakeEngine(max_num_batched_tokens=5, max_model_len=32)
    seq = engine.add("r", prompt_of(1, 13), 2).seqs[0]
    chunks = []
    while not seq.output_token_ids:
        out = engine.step()
        chunks.append(out.scheduled[0].num_new_tokens)
    assert chunks == [5, 5, 3]
    engine.run()
    engine.check_outputs()


def test_max_num_seqs_limits_running_sequences():
    engine = FakeEngine(max_num_seqs=2, max_num_batched_tokens=64)
    for i in range(5):
        engine.add(f"r{i}", prompt_of(i, 3), 4)
    engine.step()
    assert len(engine.scheduler.running) == 2 and len(engine.scheduler.waiting) == 3
    engine.run()
    engine.check_outputs()
    assert max(len(out.scheduled) for out in engine.history) == 2


# -- preemption -----------------------------------------------------------------------------------


def test_tiny_pool_forces_preemption_of_the_newest_and_every_request_completes_identically():
    # 8 usable pages of 4 tokens: exactly one max_model_len sequence.
    engine = run_workload(
        num_pages=9, page_size=4, max_model_len=32, max_num_seqs=4, max_num_batched_tokens=8
    )
    assert engine.scheduler.num_preemptions > 0
    assert sum(seq.num_preemptions for seq in engine.all_seqs()) == engine.scheduler.num_preemptions
    reference = run_workload(
        num_pages=64, page_size=4, max_model_len=32, max_num_seqs=4, max_num_batched_tokens=8
    )
    assert reference.scheduler.num_preemptions == 0
    assert engine.outputs() == reference.outputs()
    assert engine.scheduler.kv_pages_peak <= 8


def test_preempted_sequence_frees_its_pages_and_goes_back_to_the_front_of_the_queue():
    engine = FakeEngine(
        num_pages=5,
        page_size=2,
        max_model_len=8,
        max_num_seqs=2,
        max_num_batched_tokens=16,
        enable_prefix_caching=False,
    )
    old = engine.add("old", [1, 2, 3], 5).seqs[0]
    new = engine.add("new", [4, 5, 6], 5).seqs[0]
    engine.add("later", [7, 8], 2)
    engine.step()  # both prefill: 2 pages each, the pool of 4 is full
    assert engine.allocator.num_free_pages == 0
    out = engine.step()  # both decode at position 3: in their second page still
    assert out.preempted == []
    out = engine.step()  # position 4 needs a third page: the newer one is preempted
    assert out.preempted == [new]
    assert [s.seq for s in out.scheduled] == [old]
    assert new.block_table == [] and new.num_computed_tokens == 0 and new.num_preemptions == 1
    assert engine.scheduler.waiting[0] is new, "preempted ahead of the waiting requests"
    assert new.output_token_ids, "generated tokens are kept and recomputed"
    engine.run()
    engine.check_outputs()


def test_preemption_by_recompute_reuses_cached_pages_of_the_preempted_sequence():
    engine = run_workload(
        num_pages=9, page_size=4, max_model_len=32, max_num_seqs=4, max_num_batched_tokens=8
    )
    recomputed = [seq for seq in engine.all_seqs() if seq.num_preemptions]
    assert recomputed
    assert any(seq.num_cached_tokens > 0 for seq in recomputed), "readmitted from cached pages"


# -- admission order and batching policies --------------------------------------------------------


def test_admission_is_first_come_first_served():
    engine = FakeEngine(max_num_seqs=1, max_num_batched_tokens=64)
    reqs = [engine.add(f"r{i}", prompt_of(i, 2 + i), 3) for i in range(4)]
    admitted = []
    while engine.scheduler.has_unfinished():
        engine.now += 1
        for item in engine.step().scheduled:
            if item.seq not in admitted:
                admitted.append(item.seq)
    assert admitted == [r.seqs[0] for r in reqs]
    times = [r.seqs[0].first_scheduled_time for r in reqs]
    assert times == sorted(times) and len(set(times)) == 4


def test_a_request_that_does_not_fit_blocks_later_smaller_ones():
    engine = FakeEngine(
        num_pages=9,
        page_size=2,
        max_model_len=16,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        enable_prefix_caching=False,
    )
    a = engine.add("a", prompt_of(1, 9), 6).seqs[0]  # 5 of the 8 pages
    engine.step()
    big = engine.add("big", prompt_of(2, 9), 2).seqs[0]  # another 5: does not fit yet
    small = engine.add("small", [1], 2).seqs[0]  # would fit, but arrived later
    out = engine.step()
    assert [s.seq for s in out.scheduled] == [a]
    assert list(engine.scheduler.waiting) == [big, small]
    engine.run()
    engine.check_outputs()
    assert big.first_scheduled_time <= small.first_scheduled_time


def test_static_batching_admits_only_into_an_empty_engine():
    engine = FakeEngine(
        max_num_seqs=2, batch_at_a_time=True, max_batch_delay=0.0, max_num_batched_tokens=64
    )
    a, b = engine.add("a", [1, 2], 3).seqs[0], engine.add("b", [3], 5).seqs[0]
    c = engine.add("c", [4, 5, 6], 2).seqs[0]
    out = engine.step()
    assert [s.seq for s in out.scheduled] == [a, b]
    while not b.is_finished:
        assert c.status == SequenceStatus.WAITING, "admitted before the batch finished"
        engine.step()
    assert a.is_finished
    assert [s.seq for s in engine.step().scheduled] == [c]
    engine.run()
    engine.check_outputs()


def test_static_batching_admits_a_partial_batch_at_once():
    engine = FakeEngine(max_num_seqs=4, batch_at_a_time=True, max_batch_delay=0.0)
    a = engine.add("a", [1, 2], 3, arrival_time=0.0).seqs[0]
    assert [s.seq for s in engine.step(now=0.0).scheduled] == [a]


def test_dynamic_batching_waits_max_batch_delay_for_a_full_batch():
    engine = FakeEngine(max_num_seqs=3, batch_at_a_time=True, max_batch_delay=1.0)
    a = engine.add("a", [1, 2], 3, arrival_time=10.0).seqs[0]
    assert engine.step(now=10.0).is_empty
    b = engine.add("b", [3, 4], 3, arrival_time=10.5).seqs[0]
    assert engine.step(now=10.9).is_empty
    out = engine.step(now=11.0)  # the oldest waited max_batch_delay: go with what is there
    assert [s.seq for s in out.scheduled] == [a, b]
    engine.now = 11.0
    engine.run()
    engine.check_outputs()


def test_dynamic_batching_starts_at_once_when_the_batch_is_full():
    engine = FakeEngine(max_num_seqs=2, batch_at_a_time=True, max_batch_delay=100.0)
    a = engine.add("a", [1, 2], 3, arrival_time=0.0).seqs[0]
    assert engine.step(now=0.0).is_empty
    b = engine.add("b", [3], 3, arrival_time=0.0).seqs[0]
    c = engine.add("c", [5], 3, arrival_time=0.0).seqs[0]
    assert [s.seq for s in engine.step(now=0.0).scheduled] == [a, b]
    while not (a.is_finished and b.is_finished):
        engine.step(now=0.0)
    assert engine.step(now=0.0).is_empty, "c alone waits for a full batch or the delay"
    assert [s.seq for s in engine.step(now=100.0).scheduled] == [c]


def test_contiguous_allocator_with_continuous_batching_completes_every_request():
    engine = run_workload(contiguous=True, max_num_seqs=3, max_num_batched_tokens=8)
    assert engine.scheduler.num_preemptions == 0
    assert engine.allocator.num_used_pages == 0


def test_contiguous_allocator_with_static_batching_completes_every_request():
    engine = run_workload(
        contiguous=True, max_num_seqs=3, batch_at_a_time=True, max_num_batched_tokens=3 * 32
    )
    assert engine.scheduler.kv_pages_peak == 3 * engine.allocator.pages_per_slot


# -- abort ----------------------------------------------------------------------------------------


def test_abort_of_a_waiting_request_removes_it_without_touching_pages():
    engine = FakeEngine(max_num_seqs=1)
    engine.add("a", [1, 2, 3], 4)
    b = engine.add("b", [4, 5, 6], 4).seqs[0]
    engine.step()
    used = engine.allocator.num_used_pages
    engine.abort("b")
    assert b.is_finished and b.finish_reason == "abort"
    assert b not in engine.scheduler.waiting
    assert engine.allocator.num_used_pages == used
    engine.run()
    engine.check_outputs()


def test_abort_of_a_running_request_frees_its_pages():
    engine = FakeEngine(page_size=2, max_num_seqs=2, enable_prefix_caching=False)
    a = engine.add("a", [1, 2, 3, 4, 5], 8).seqs[0]
    engine.add("b", [6, 7, 8], 8)
    engine.step()
    engine.step()
    assert len(a.block_table) == 3
    engine.abort("b")
    engine.check_invariants()
    assert engine.allocator.num_used_pages == 3
    engine.abort("a")
    engine.check_invariants()
    assert engine.allocator.num_used_pages == 0 and not engine.scheduler.has_unfinished()


def test_abort_keeps_pages_shared_with_another_sequence():
    engine = FakeEngine(page_size=2, max_num_seqs=4)
    prompt = [1, 2, 3, 4, 5, 6, 7]
    a = engine.add("a", prompt, 6).seqs[0]
    engine.step()
    b = engine.add("b", prompt, 6).seqs[0]
    engine.step()
    assert b.num_cached_tokens == 6 and b.block_table[:3] == a.block_table[:3]
    engine.abort("a")
    assert all(engine.allocator.ref_counts[p] == 1 for p in b.block_table)
    engine.run()
    engine.check_outputs()


# -- prefix caching and parallel samples ----------------------------------------------------------


def test_later_request_with_the_same_prefix_reuses_cached_pages_and_generates_the_same():
    engine = FakeEngine(page_size=4)
    prompt = prompt_of(9, 14)
    first = engine.add("first", prompt, 3).seqs[0]
    engine.run()
    second = engine.add("second", prompt + [1, 2], 3).seqs[0]
    out = engine.step()
    assert second.num_cached_tokens == 12
    assert out.scheduled[0].num_new_tokens == 4
    engine.run()
    engine.check_outputs()
    assert first.output_token_ids == reference_tokens(prompt, 3)


def test_n_siblings_wait_for_the_first_prompt_and_then_share_its_pages():
    engine = FakeEngine(page_size=4, max_num_seqs=4)
    prompt = prompt_of(3, 10)  # 2 full pages, then the page of the last prompt token
    req = engine.add("r", prompt, 5, n=3)
    first, *siblings = req.seqs
    out = engine.step()
    assert [s.seq for s in out.scheduled] == [first], "siblings wait for the first's prompt"
    assert all(s.status == SequenceStatus.WAITING for s in siblings)
    out = engine.step()
    assert [s.seq for s in out.scheduled] == [first, *siblings]
    for sibling in siblings:
        assert sibling.num_cached_tokens == 8
        assert sibling.block_table[:2] == first.block_table[:2]
        assert sibling.block_table[2] != first.block_table[2]
    assert [engine.allocator.ref_counts[p] for p in first.block_table[:2]] == [3, 3]
    engine.run()
    engine.check_outputs()
    assert len({tuple(s.output_token_ids) for s in req.seqs}) == 3, "samples differ by index"


def test_n_siblings_proceed_when_the_first_sequence_is_aborted():
    engine = FakeEngine(max_num_seqs=4, max_num_batched_tokens=4)
    req = engine.add("r", prompt_of(3, 12), 3, n=2)
    engine.step()
    engine.scheduler.finish(req.seqs[0], "abort")
    req.aborted = True
    engine.run()
    assert req.seqs[1].finish_reason == "length"
    engine.check_outputs()


def test_n_siblings_under_static_batching_run_in_the_same_batch():
    engine = FakeEngine(
        contiguous=True, max_num_seqs=4, batch_at_a_time=True, max_num_batched_tokens=4 * 32
    )
    req = engine.add("r", prompt_of(3, 6), 4, n=3)
    out = engine.step()
    assert [s.seq for s in out.scheduled] == req.seqs
    engine.run()
    engine.check_outputs()
    assert engine.num_steps == 4


def test_add_rejects_a_prompt_without_room_and_a_pool_below_one_sequence():
    engine = FakeEngine(max_model_len=8)
    with pytest.raises(ValueError, match="max_model_len"):
        engine.scheduler.add(Sequence(list(range(8)), max_tokens=1))
    small = Scheduler(
        SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=8, max_model_len=8),
        PageAllocator(2, 4),
    )
    with pytest.raises(ValueError, match="KV pool"):
        small.add(Sequence([1], max_tokens=1))


# -- random workloads over tight pools -------------------------------------------------------------


@st.composite
def workloads(draw):
    """A paged engine with a pool of one or two long sequences, and requests arriving over time."""
    page_size = draw(st.integers(1, 4))
    max_model_len = draw(st.integers(6, 24))
    max_num_seqs = draw(st.integers(2, 4))
    min_pages = -(-max_model_len // page_size)
    config = dict(
        page_size=page_size,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        num_pages=1 + min_pages + draw(st.integers(0, 3)),
        max_num_batched_tokens=draw(st.integers(max_num_seqs, 2 * max_model_len)),
        enable_prefix_caching=draw(st.booleans()),
    )
    arrivals = draw(
        st.lists(
            st.tuples(
                st.integers(0, 6),  # step at which it arrives
                st.integers(0, 24),  # tokens of the shared prompt it starts with
                st.lists(st.integers(0, 9), max_size=6),
                st.one_of(st.integers(1, 3), st.integers(4, 16)),  # max_tokens
                st.sampled_from([1, 1, 2]),  # n
                st.one_of(st.none(), st.integers(0, 20)),  # aborted at this step, if any
            ),
            min_size=2,
            max_size=8,
        )
    )
    return config, arrivals


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads())
def test_random_workloads_over_tight_pools_finish_with_the_reference_tokens(workload):
    config, arrivals = workload
    engine = FakeEngine(**config)
    room = config["max_model_len"] - 1
    aborts: dict[int, list[str]] = collections.defaultdict(list)
    for step in range(max(a[0] for a in arrivals) + 1):
        for i, (at, shared, tail, max_tokens, n, abort_at) in enumerate(arrivals):
            if at == step:
                prompt = (SHARED_PROMPT[:shared] + tail)[:room] or [0]
                engine.add(f"r{i}", prompt, max_tokens, n=n)
                if abort_at is not None:
                    aborts[step + abort_at].append(f"r{i}")
        for request_id in aborts.pop(step, []):
            engine.abort(request_id)
        engine.step()
    while engine.scheduler.has_unfinished():
        step += 1
        assert step < 5_000, "no progress"
        for request_id in aborts.pop(step, []):
            engine.abort(request_id)
        if engine.scheduler.has_unfinished():
            assert not engine.step().is_empty, "an idle step with unfinished requests"
    engine.check_outputs()
    assert engine.allocator.num_used_pages == 0
    assert all(count == 0 for count in engine.allocator.ref_counts)
    event(f"preempted: {engine.scheduler.num_preemptions > 0}")
    event(f"prefix hits: {engine.allocator.prefix_hits > 0}")


# -- the stateful model: random arrivals, aborts and pools never deadlock -------------------------


@st.composite
def engine_configs(draw):
    page_size = draw(st.integers(1, 4))
    max_model_len = draw(st.integers(4, 24))
    max_num_seqs = draw(st.integers(1, 4))
    contiguous = draw(st.sampled_from([False, False, False, True]))
    batch_at_a_time = draw(st.sampled_from([False, False, False, True]))
    min_pages = -(-max_model_len // page_size)
    if batch_at_a_time:  # as LLMEngine: a whole batch of prompts fits one step
        budget = max_num_seqs * max_model_len
    else:
        budget = draw(st.one_of(st.integers(1, 8), st.integers(1, 3 * max_model_len)))
    return dict(
        page_size=page_size,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        num_pages=1 + min_pages + draw(st.integers(0, min_pages)),  # small: preemptions
        max_num_batched_tokens=budget,
        enable_prefix_caching=draw(st.sampled_from([True, True, False])),
        contiguous=contiguous,
        batch_at_a_time=batch_at_a_time,
        max_batch_delay=draw(st.sampled_from([0.0, 1.0])) if batch_at_a_time else 0.0,
    )


class SchedulerMachine(RuleBasedStateMachine):
    """Random arrivals (shared prefixes, n > 1), steps, aborts and clock ticks."""

    @initialize(config=engine_configs())
    def setup(self, config):
        self.engine = FakeEngine(**config)
        self.next_id = 0

    @rule(
        requests=st.lists(
            st.tuples(
                st.integers(0, 24),  # tokens of the shared prompt it starts with
                st.lists(st.integers(0, 9), max_size=8),
                st.integers(1, 12),  # max_tokens
                st.sampled_from([1, 1, 1, 2, 3]),  # n
            ),
            min_size=1,
            max_size=3,
        )
    )
    def add_requests(self, requests):
        room = self.engine.config.max_model_len - 1
        for shared, tail, max_tokens, n in requests:
            prompt = (SHARED_PROMPT[:shared] + tail)[:room] or [0]
            self.engine.add(f"r{self.next_id}", prompt, max_tokens, n=n)
            self.next_id += 1

    @rule(times=st.integers(1, 4))
    def step(self, times):
        for _ in range(times):
            self.engine.step()

    @rule(data=st.data())
    def abort(self, data):
        live = [r for r in self.engine.requests.values() if not all(s.is_finished for s in r.seqs)]
        if live:
            self.engine.abort(data.draw(st.sampled_from(live)).request_id)

    @rule(dt=st.sampled_from([0.25, 1.0]))
    def tick(self, dt):
        self.engine.now += dt

    @invariant()
    def invariants(self):
        self.engine.check_invariants()

    def teardown(self):
        if not hasattr(self, "engine"):
            return
        engine = self.engine
        engine.run(dt=2.0)  # past any max_batch_delay: every step must make progress
        engine.check_outputs()
        event(f"preempted: {engine.scheduler.num_preemptions > 0}")
        event(f"chunked prefill: {engine.num_prefill_chunks > 0}")
        event(f"prefix hits: {engine.allocator.prefix_hits > 0}")
        event(f"n > 1: {any(len(r.seqs) > 1 for r in engine.requests.values())}")
        event(f"aborted: {any(r.aborted for r in engine.requests.values())}")
        assert engine.allocator.num_used_pages == 0
        if engine.paged:
            assert all(count == 0 for count in engine.allocator.ref_counts)


SchedulerMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSchedulerMachine = SchedulerMachine.TestCase


def test_a_sequence_crossing_the_long_rope_threshold_is_recomputed_in_place():
    """LongRoPE: once a sequence holds more than the original context, its keys (rotated with
    the short factors) are recomputed with the long ones: its pages are freed, it stays
    running, and its next step prefills every token; the short pages stay cached under the
    short variant only."""
    allocator = PageAllocator(16, 4)
    config = SchedulerConfig(
        max_num_seqs=2, max_num_batched_tokens=64, max_model_len=32, long_rope_threshold=8
    )
    scheduler = Scheduler(config, allocator)
    seq = Sequence(list(range(7)), max_tokens=10)
    scheduler.add(seq)
    out = scheduler.schedule()
    assert [s.num_new_tokens for s in out.scheduled] == [7] and not seq.long_rope
    scheduler.postprocess(out, {seq.seq_id: 100})  # 8 tokens: still within the context
    assert seq.num_computed_tokens == 7 and not seq.long_rope
    out = scheduler.schedule()
    scheduler.postprocess(out, {seq.seq_id: 101})  # 9 tokens: crossed
    assert seq.long_rope and seq.num_computed_tokens == 0 and seq.block_table == []
    assert scheduler.running == [seq] and scheduler.num_rope_recomputes == 1
    assert allocator.num_used_pages == 0
    out = scheduler.schedule()
    assert [s.num_new_tokens for s in out.scheduled] == [9] and out.scheduled[0].completes
    scheduler.postprocess(out, {seq.seq_id: 102})
    assert scheduler.num_rope_recomputes == 1  # once only

    # The short pages of the first 8 tokens are cached for short sequences only.
    short = Sequence(list(range(7)) + [100, 5], max_tokens=1)
    assert allocator.match_prefix(short) == 8
    long = Sequence(list(range(7)) + [100, 5], max_tokens=1)
    long.long_rope = True
    assert allocator.match_prefix(long) == 8  # the recomputed sequence's long pages
    assert set(long.block_table).isdisjoint(short.block_table)


def test_a_prompt_longer_than_the_long_rope_threshold_uses_the_long_factors_from_the_start():
    scheduler = Scheduler(
        SchedulerConfig(
            max_num_seqs=2, max_num_batched_tokens=4, max_model_len=32, long_rope_threshold=8
        ),
        PageAllocator(16, 4),
    )
    seq = Sequence(list(range(10)), max_tokens=4)
    scheduler.add(seq)
    for _ in range(3):  # chunks of 4, 4, 2: every one rotated with the long factors
        out = scheduler.schedule()
        assert seq.long_rope
        scheduler.postprocess(out, {seq.seq_id: 1} if out.scheduled[0].completes else {})
    assert seq.num_generated == 1 and scheduler.num_rope_recomputes == 0
