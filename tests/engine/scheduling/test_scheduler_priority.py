"""The ``priority`` scheduling policy (``jaxgen.engine.scheduling.policy``): admission by
(priority, arrival), a preempted sequence back at its place in the queue, the running sequence
of the lowest priority preempted for a waiting one's slot or pages (never one of equal
priority), and ``fcfs`` unchanged; on the fake engine of
``tests/engine/scheduling/fake_scheduler_engine.py``, whose outputs must stay the reference
tokens however often sequences are preempted."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxgen.config.engine_config import SCHEDULING_POLICIES, EngineConfig
from jaxgen.engine.scheduling.policy import (
    POLICIES,
    check_priority,
    priority_key,
    scheduling_policy,
)
from tests.engine.scheduling.fake_scheduler_engine import SHARED_PROMPT, FakeEngine, prompt_of

# (request id, priority, arrival)
REQUESTS = [("a", 5, 0.0), ("b", 0, 1.0), ("c", 5, 2.0), ("d", 0, 3.0), ("e", -2, 4.0)]


def admission_order(policy: str) -> list[str]:
    """The order one slot serves ``REQUESTS`` (all queued before the first step) in."""
    engine = FakeEngine(max_num_seqs=1, scheduling_policy=policy)
    for request_id, priority, arrival in REQUESTS:
        engine.add(
            request_id, prompt_of(len(request_id), 3), 2, arrival_time=arrival, priority=priority
        )
    first_scheduled = []
    while engine.scheduler.has_unfinished():
        for item in engine.step().scheduled:
            if item.seq.request_id not in first_scheduled:
                first_scheduled.append(item.seq.request_id)
    engine.check_outputs()
    assert engine.scheduler.num_preemptions == 0
    return first_scheduled


def test_admission_by_priority_then_arrival():
    assert admission_order("priority") == ["e", "b", "d", "a", "c"]


def test_fcfs_admits_by_arrival_whatever_the_priorities():
    assert admission_order("fcfs") == ["a", "b", "c", "d", "e"]


def test_queue_stays_sorted_by_priority_and_arrival():
    engine = FakeEngine(max_num_seqs=1, scheduling_policy="priority")
    for request_id, priority, arrival in REQUESTS:
        engine.add(request_id, prompt_of(1, 3), 2, arrival_time=arrival, priority=priority)
    waiting = list(engine.scheduler.waiting)
    assert [seq.request_id for seq in waiting] == ["e", "b", "d", "a", "c"]
    assert waiting == sorted(waiting, key=priority_key)


def test_higher_priority_waiting_preempts_the_lowest_priority_running_for_a_slot():
    engine = FakeEngine(max_num_seqs=2, scheduling_policy="priority")
    old = engine.add("old", prompt_of(1, 4), 8, priority=3).seqs[0]
    new = engine.add("new", prompt_of(2, 4), 8, arrival_time=1.0, priority=3).seqs[0]
    engine.step()
    engine.step()
    assert engine.scheduler.running == [old, new]
    urgent = engine.add("urgent", prompt_of(3, 4), 3, arrival_time=2.0, priority=0).seqs[0]
    out = engine.step()
    assert out.preempted == [new], "the latest arrival of the lowest priority gives its slot"
    assert [item.seq for item in out.scheduled] == [old, urgent]
    assert new.num_preemptions == 1 and new.block_table == [] and new.output_token_ids
    assert list(engine.scheduler.waiting) == [new]
    engine.run()
    engine.check_outputs()
    assert urgent.finish_reason == "length"


def test_equal_priority_never_preempts():
    engine = FakeEngine(max_num_seqs=2, scheduling_policy="priority")
    for i in range(2):
        engine.add(f"r{i}", prompt_of(i, 4), 6, arrival_time=float(i), priority=1)
    engine.step()
    later = engine.add("later", prompt_of(9, 4), 3, arrival_time=5.0, priority=1).seqs[0]
    early = engine.add("early", prompt_of(8, 4), 3, arrival_time=-1.0, priority=1).seqs[0]
    out = engine.step()
    assert out.preempted == [] and engine.scheduler.num_preemptions == 0
    assert list(engine.scheduler.waiting) == [early, later], "an earlier arrival waits first"
    engine.run()
    engine.check_outputs()
    assert engine.scheduler.num_preemptions == 0


def test_higher_priority_waiting_preempts_for_pages():
    # 8 usable pages of 2 tokens: two sequences of 8 tokens fill the pool.
    engine = FakeEngine(
        num_pages=9,
        page_size=2,
        max_model_len=12,
        max_num_seqs=4,
        max_num_batched_tokens=32,
        enable_prefix_caching=False,
        scheduling_policy="priority",
    )
    low = engine.add("low", prompt_of(1, 7), 4, priority=2).seqs[0]
    mid = engine.add("mid", prompt_of(2, 7), 4, arrival_time=1.0, priority=1).seqs[0]
    engine.step()  # both prefill 7 tokens: 4 pages each, the pool is full
    assert engine.allocator.num_free_pages == 0
    high = engine.add("high", prompt_of(3, 3), 2, arrival_time=2.0, priority=0).seqs[0]
    out = engine.step()
    assert out.preempted == [low], "the lowest priority gives its pages, though it came first"
    assert high in [item.seq for item in out.scheduled] and mid in engine.scheduler.running
    engine.run()
    engine.check_outputs()


def test_pages_running_out_preempt_the_lowest_priority_not_the_newest():
    engine = FakeEngine(
        num_pages=5,
        page_size=2,
        max_model_len=8,
        max_num_seqs=2,
        max_num_batched_tokens=16,
        enable_prefix_caching=False,
        scheduling_policy="priority",
    )
    old = engine.add("old", [1, 2, 3], 5, priority=1).seqs[0]
    new = engine.add("new", [4, 5, 6], 5, arrival_time=1.0, priority=0).seqs[0]
    engine.step()  # both prefill: 2 pages each, the pool of 4 is full
    engine.step()
    out = engine.step()  # position 4 needs a third page: under fcfs the newer would go
    assert out.preempted == [old]
    assert [item.seq for item in out.scheduled] == [new]
    engine.run()
    engine.check_outputs()


def test_a_preempted_sequence_goes_back_to_its_place_in_the_queue():
    engine = FakeEngine(max_num_seqs=1, scheduling_policy="priority")
    running = engine.add("running", prompt_of(1, 4), 6, arrival_time=1.0, priority=2).seqs[0]
    engine.step()
    queued_before = engine.add("before", prompt_of(2, 4), 2, arrival_time=0.0, priority=2).seqs[0]
    queued_after = engine.add("after", prompt_of(3, 4), 2, arrival_time=5.0, priority=2).seqs[0]
    urgent = engine.add("urgent", prompt_of(4, 4), 2, arrival_time=6.0, priority=0).seqs[0]
    out = engine.step()
    assert out.preempted == [running] and engine.scheduler.running == [urgent]
    assert list(engine.scheduler.waiting) == [queued_before, running, queued_after]
    engine.run()
    engine.check_outputs()


def test_a_request_of_n_samples_preempts_with_its_priority():
    engine = FakeEngine(max_num_seqs=2, scheduling_policy="priority")
    low = engine.add("low", prompt_of(1, 9), 12, priority=1).seqs[0]
    engine.step()
    request = engine.add("high", prompt_of(1, 9), 4, arrival_time=1.0, n=3, priority=0)
    engine.run()
    engine.check_outputs()
    assert all(seq.priority == 0 for seq in request.seqs)
    assert low.num_preemptions >= 1, "a second sample took the low request's slot"


@st.composite
def prioritised_workloads(draw):
    page_size = draw(st.integers(1, 4))
    max_model_len = draw(st.integers(6, 20))
    max_num_seqs = draw(st.integers(1, 4))
    min_pages = -(-max_model_len // page_size)
    config = dict(
        page_size=page_size,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        num_pages=1 + min_pages + draw(st.integers(0, 3)),
        max_num_batched_tokens=draw(st.integers(max(max_num_seqs, 2), 2 * max_model_len)),
        enable_prefix_caching=draw(st.booleans()),
        scheduling_policy="priority",
    )
    arrivals = draw(
        st.lists(
            st.tuples(
                st.integers(0, 6),  # step at which it arrives
                st.integers(0, 20),  # tokens of the shared prompt it starts with
                st.lists(st.integers(0, 9), max_size=5),
                st.integers(1, 10),  # max_tokens
                st.sampled_from([1, 1, 2]),  # n
                st.integers(-2, 3),  # priority
            ),
            min_size=2,
            max_size=8,
        )
    )
    return config, arrivals


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=prioritised_workloads())
def test_random_prioritised_workloads_finish_with_the_reference_tokens(workload):
    config, arrivals = workload
    engine = FakeEngine(**config)
    room = config["max_model_len"] - 1
    by_step = collections.defaultdict(list)
    for i, arrival in enumerate(arrivals):
        by_step[arrival[0]].append((i, *arrival[1:]))
    for step in range(max(by_step) + 1):
        for i, shared, tail, max_tokens, n, priority in by_step[step]:
            prompt = (SHARED_PROMPT[:shared] + tail)[:room] or [0]
            engine.add(f"r{i}", prompt, max_tokens, n=n, priority=priority)
        engine.now += 1.0
        engine.step()
    engine.run(dt=1.0)
    engine.check_outputs()
    assert engine.allocator.num_used_pages == 0


def test_scheduling_policy_names():
    assert tuple(POLICIES) == SCHEDULING_POLICIES
    assert scheduling_policy("fcfs").name == "fcfs"
    assert scheduling_policy("priority").name == "priority"
    with pytest.raises(ValueError, match="scheduling_policy"):
        scheduling_policy("lifo")
    with pytest.raises(ValueError, match="scheduling_policy must be one of 'fcfs', 'priority'"):
        EngineConfig(scheduling_policy="lifo")
    assert EngineConfig().scheduling_policy == "fcfs"


@pytest.mark.parametrize("bad", [True, False, 1.0, "1", None, [1]])
def test_a_priority_that_is_no_int_is_refused(bad):
    with pytest.raises(ValueError, match="^priority must be an int"):
        check_priority(bad, "priority")


def test_priority_values():
    assert check_priority(0, "fcfs") == 0
    assert check_priority(-7, "priority") == -7
    assert (
        check_priority(np.int64(3), "priority") == 3 and type(check_priority(3, "priority")) is int
    )
    with pytest.raises(ValueError, match="^priority 1 needs scheduling_policy='priority'"):
        check_priority(1, "fcfs")
