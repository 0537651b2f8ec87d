"""Tests for jaxgen.engine.scheduling.scheduler's preemption by recompute, prefix sharing between requests
and between a request's ``n`` sequences, and the long-RoPE recompute, on the fake engine of
``tests/engine/scheduling/fake_scheduler_engine.py``."""

from __future__ import annotations

from jaxgen.engine.scheduling.page_allocator import PageAllocator
from jaxgen.engine.scheduling.scheduler import Scheduler, SchedulerConfig
from jaxgen.engine.scheduling.sequence import Sequence, SequenceStatus
from tests.engine.scheduling.fake_scheduler_engine import (
    FakeEngine,
    prompt_of,
    reference_tokens,
    run_workload,
)

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
