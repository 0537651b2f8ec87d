"""The step in flight: launching a step on the runner and reading its tokens back.

``StepExecutor`` runs the batches the engine builds and keeps the step dispatched but not read
(asynchronous scheduling: the next step is launched before this one's tokens are read, and its
rows holding a ``PENDING_TOKEN`` take the real token on the device). Reading fetches the
sampler's arrays and unpacks them per sequence, per decode step for a multi-step call. It never
schedules and never post-processes: the tokens go back to ``LLMEngine``. Whether a step may
run ahead of the host is ``scheduling.multi_step``' question.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxgen.engine.sampling.prompt_logprobs import unpack_prompt_logprobs
from jaxgen.engine.scheduling.scheduler import SchedulerOutput
from jaxgen.engine.scheduling.sequence import Sequence
from jaxgen.engine.step.runner import InFlight, ModelRunner
from jaxgen.engine.step.step_batch import StepBatch, unpack

# The token a sequence has while the step that samples it is in flight.
PENDING_TOKEN = -1


@dataclasses.dataclass
class DispatchedStep:
    """A step on the device: what was scheduled, its host batch and its device result."""

    scheduled: SchedulerOutput | None
    batch: StepBatch
    step: InFlight
    start: float  # when its batch began to be built (perf_counter)
    num_steps: int = 1  # decode steps the call runs (multi-step decoding)

    def live_items(self) -> SchedulerOutput:
        """What was scheduled, without the sequences that ended since (a step launched ahead
        of their end: its row for them is discarded)."""
        items = [item for item in self.scheduled.scheduled if not item.seq.is_finished]
        return SchedulerOutput(items, self.scheduled.preempted)

    def live_seqs(self) -> list[Sequence]:
        """The sequences its rows sample for that have not ended (padding rows are None)."""
        return [seq for seq in self.batch.seqs if seq is not None and not seq.is_finished]


@dataclasses.dataclass
class StepTokens:
    """What one decode step sampled, per sequence."""

    tokens: dict[int, int]  # seq_id -> token
    logprobs: dict[int, dict[int, float]]  # seq_id -> {token: logprob}, when the row asked


@dataclasses.dataclass
class StepResult:
    """A read step: its tokens (one entry, or ``num_steps`` for a multi-step call) and the
    prompt logprobs it computed (seq_id -> entries)."""

    steps: list[StepTokens]
    prompt_logprobs: dict[int, list]


def merged(scheduled: SchedulerOutput, other: DispatchedStep | None) -> SchedulerOutput:
    """``scheduled`` with the sequences of ``other`` (a step in flight) added, for recovery."""
    if other is None or other.scheduled is None:
        return scheduled
    return SchedulerOutput(scheduled.scheduled + other.scheduled.scheduled, scheduled.preempted)


class StepExecutor:
    """Runs steps on the runner and owns the one in flight."""

    def __init__(self, runner: ModelRunner, *, async_feed: bool, feed_width: int):
        self.runner = runner
        # The step dispatched and not read yet (asynchronous scheduling), and the feed a step
        # takes when nothing is in flight (every row's token from the host).
        self.in_flight: DispatchedStep | None = None
        self._empty_feed = None
        if async_feed:
            self._empty_feed = jax.numpy.zeros(feed_width, jax.numpy.int32)

    def launch(
        self,
        batch: StepBatch,
        scheduled: SchedulerOutput | None = None,
        start: float = 0.0,
        num_steps: int = 1,
        *,
        after: DispatchedStep | None = None,
    ) -> DispatchedStep:
        """Dispatches ``batch`` (the step of ``scheduled``, ``num_steps`` decode steps) without
        waiting; with asynchronous scheduling its rows holding a pending token take it from
        ``after``'s feed."""
        pending = ()  # asynchronous scheduling: (from_previous, previous_tokens)
        if self._empty_feed is not None:
            pending = self._pending_feed(batch, after)
        step = self.runner.dispatch(
            batch.arrays, batch.prompt_targets, *pending, num_steps=num_steps
        )
        return DispatchedStep(scheduled, batch, step, start, num_steps)

    def read(self, step: DispatchedStep) -> StepResult:
        """Waits for ``step`` and unpacks its tokens per sequence (per decode step)."""
        output, prompt_output = self.runner.fetch(step.step)
        outputs = [output]
        if step.num_steps > 1:
            leaves, treedef = jax.tree_util.tree_flatten(output)  # each [num_steps, S, ...]
            outputs = [
                jax.tree_util.tree_unflatten(treedef, [leaf[index] for leaf in leaves])
                for index in range(step.num_steps)
            ]
        prompt = {}
        if prompt_output is not None:
            prompt = unpack_prompt_logprobs(step.batch.prompt, prompt_output)
        return StepResult([StepTokens(*unpack(step.batch, out)) for out in outputs], prompt)

    def run_now(self, batch: StepBatch, num_steps: int = 1):
        """Runs ``batch`` and waits for it (precompiling): the sampler's output and the prompt
        logprobs; nothing is kept in flight."""
        return self.runner.fetch(self.launch(batch, num_steps=num_steps).step)

    def hold(self, step: DispatchedStep) -> None:
        """Keeps ``step`` in flight, to be read by a later engine step."""
        self.in_flight = step

    def take(self) -> DispatchedStep | None:
        """The step in flight (or None), which is no longer held."""
        step, self.in_flight = self.in_flight, None
        return step

    def _pending_feed(self, batch: StepBatch, previous: DispatchedStep | None) -> tuple:
        """The runner's ``(from_previous, previous_tokens)`` for ``batch``: for each of its
        tokens the row of ``previous`` that samples it (-1: the token is on the host), and
        ``previous``'s feed (the empty feed when nothing is in flight)."""
        token_ids = batch.inputs.token_ids
        from_previous = np.full(token_ids.shape[0], -1, np.int32)  # [T]
        pending = np.flatnonzero(token_ids == PENDING_TOKEN)
        if pending.size:
            rows = {seq.seq_id: row for row, seq in enumerate(previous.batch.seqs) if seq}
            cu = batch.inputs.metadata.cu_q_lens
            for index, item in enumerate(batch.inputs.rows):
                if item is None:
                    continue
                mine = pending[(pending >= cu[index]) & (pending < cu[index + 1])]
                if mine.size:
                    from_previous[mine] = rows[item.seq.seq_id]
        feed = self._empty_feed if previous is None else previous.step.feed
        return from_previous, feed
