"""A step on the device whose tokens the host has not read yet, and which of its sequences
are still live (shared by the engine, asynchronous scheduling and multi-step decoding)."""

from __future__ import annotations

import dataclasses

from jaxgen.engine.runner import InFlight
from jaxgen.engine.scheduler import SchedulerOutput
from jaxgen.engine.step_batch import StepBatch


@dataclasses.dataclass
class DispatchedStep:
    """A step on the device: what was scheduled, its host batch and its device result."""

    scheduled: SchedulerOutput | None
    batch: StepBatch
    step: InFlight
    start: float  # when its batch began to be built (perf_counter)
    num_steps: int = 1  # decode steps the call runs (multi-step decoding)


def live_items(scheduled: SchedulerOutput) -> SchedulerOutput:
    """``scheduled`` without the sequences that ended since it was scheduled (the step ahead
    of them had already been dispatched: its row for them is discarded)."""
    items = [item for item in scheduled.scheduled if not item.seq.is_finished]
    return SchedulerOutput(items, scheduled.preempted)
