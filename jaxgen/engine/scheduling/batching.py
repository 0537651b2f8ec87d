"""What each batching mode means: the scheduler's limits and policy, the allocator and the step
layout's decode floor, in one place."""

from __future__ import annotations

import dataclasses

from jaxgen.config.engine_config import EngineConfig
from jaxgen.engine.scheduling.scheduler import SchedulerConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchingPlan:
    """The settings a batching mode gives the engine's parts."""

    scheduler: SchedulerConfig
    paged: bool  # pages on demand (PageAllocator), else max_model_len reserved per slot
    min_decode_batch: int  # decode steps padded to at least this many rows (StepLayout)

    @property
    def num_slots(self) -> int:
        """Sequences that run at once."""
        return self.scheduler.max_num_seqs


def batching_plan(config: EngineConfig, max_model_len: int) -> BatchingPlan:
    """The meaning of ``config.batching``:

    - ``none``: one sequence at a time.
    - ``static``: ``batch_size`` sequences admitted together into an empty engine; decode
      steps padded to ``batch_size`` rows, as a fixed-shape batch would be.
    - ``dynamic``: as static, but a batch waits up to ``max_batch_delay`` to fill, and is not
      padded.
    - ``continuous``: up to ``max_rolling_batch_size`` sequences, admitted whenever one
      finishes, each step within ``max_rolling_batch_prefill_tokens``.
    - ``paged``: continuous, with pages on demand instead of ``max_model_len`` per slot.

    The batch-at-a-time modes (none/static/dynamic) take a whole batch of full sequences per
    step: their token budget is ``slots x max_model_len``. Raises ``ValueError`` if a rolling
    mode's token budget cannot give each running sequence a token.
    """
    mode = config.batching
    rolling = mode in ("continuous", "paged")
    if mode == "none":
        slots = 1
    elif mode in ("static", "dynamic"):
        slots = config.batch_size
    else:
        slots = config.max_rolling_batch_size
    budget = config.max_rolling_batch_prefill_tokens if rolling else slots * max_model_len
    if rolling and budget < slots:
        raise ValueError(
            f"max_rolling_batch_prefill_tokens ({budget}) must be >= max_rolling_batch_size ({slots})"
        )
    scheduler = SchedulerConfig(
        max_num_seqs=slots,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        batch_at_a_time=not rolling,
        max_batch_delay=config.max_batch_delay if mode == "dynamic" else 0.0,
        policy=config.scheduling_policy,
    )
    return BatchingPlan(
        scheduler=scheduler,
        paged=mode == "paged",
        min_decode_batch=slots if mode == "static" else 1,
    )
