"""Tests for jaxgen.engine.scheduling.scheduler: step order, token budgets, chunked prefill, admission,
static and dynamic batching, aborts, on the fake engine of
``tests/engine/scheduling/fake_scheduler_engine.py`` (plain Python, no jax)."""

from __future__ import annotations

import pytest

from jaxgen.engine.scheduling.page_allocator import PageAllocator
from jaxgen.engine.scheduling.scheduler import Scheduler, SchedulerConfig
from jaxgen.engine.scheduling.sequence import Sequence, SequenceStatus
from tests.engine.scheduling.fake_scheduler_engine import FakeEngine, prompt_of, run_workload

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
