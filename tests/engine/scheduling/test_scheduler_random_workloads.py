"""Property tests for jaxgen.engine.scheduling.scheduler: random workloads over tight pools finish with the
reference tokens, and a state machine of adds, aborts and steps keeps the pages balanced (on
the fake engine of ``tests/engine/scheduling/fake_scheduler_engine.py``)."""

from __future__ import annotations

import collections

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.engine.scheduling.fake_scheduler_engine import SHARED_PROMPT, FakeEngine

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
