"""What each batching mode means (``jaxgen.engine.scheduling.batching.batching_plan``)."""

from __future__ import annotations

import pytest

from jaxgen.config.engine_config import EngineConfig
from jaxgen.engine.scheduling.batching import batching_plan

KNOBS = dict(
    batch_size=3, max_rolling_batch_size=8, max_rolling_batch_prefill_tokens=64, max_batch_delay=0.5
)


@pytest.mark.parametrize(
    ("mode", "slots", "budget", "at_a_time", "delay", "paged", "floor"),
    [
        ("none", 1, 1 * 100, True, 0.0, False, 1),
        ("static", 3, 3 * 100, True, 0.0, False, 3),
        ("dynamic", 3, 3 * 100, True, 0.5, False, 1),
        ("continuous", 8, 64, False, 0.0, False, 1),
        ("paged", 8, 64, False, 0.0, True, 1),
    ],
)
def test_each_mode(mode, slots, budget, at_a_time, delay, paged, floor):
    plan = batching_plan(EngineConfig(batching=mode, **KNOBS), max_model_len=100)
    scheduler = plan.scheduler
    assert plan.num_slots == scheduler.max_num_seqs == slots
    assert scheduler.max_num_batched_tokens == budget and scheduler.max_model_len == 100
    assert (scheduler.batch_at_a_time, scheduler.max_batch_delay) == (at_a_time, delay)
    assert (plan.paged, plan.min_decode_batch) == (paged, floor)


def test_rolling_budget_must_cover_every_running_sequence():
    config = EngineConfig(max_rolling_batch_size=32, max_rolling_batch_prefill_tokens=16)
    with pytest.raises(ValueError, match="max_rolling_batch_prefill_tokens"):
        batching_plan(config, max_model_len=100)
    # Batch-at-a-time modes take whole sequences per step: the rolling budget does not apply.
    static = EngineConfig(batching="static", batch_size=32, max_rolling_batch_prefill_tokens=16)
    assert batching_plan(static, max_model_len=100).scheduler.max_num_batched_tokens == 3200
