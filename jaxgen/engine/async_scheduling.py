"""Asynchronous scheduling (``async_scheduling=True``): the engine dispatches step N+1 before
it reads step N's tokens; the rows of N+1 holding a pending token take it on the device."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np

from jaxgen.engine.dispatched_step import DispatchedStep, live_items
from jaxgen.engine.sampling_tensors import uses_penalties
from jaxgen.engine.step_batch import StepBatch
from jaxgen.outputs import RequestOutput

if TYPE_CHECKING:
    from jaxgen.engine.llm_engine import LLMEngine

# The token a sequence has while the step that samples it is in flight.
PENDING_TOKEN = -1


def step_ahead(engine: LLMEngine) -> list[RequestOutput]:
    """Dispatches the next step (if the one in flight allows it), then reads the one in flight.

    The step in flight has not told the host its tokens: each sequence it completes gets a
    ``PENDING_TOKEN`` in their place, so the scheduler can plan the next step (pages,
    positions) and the next step's rows take the real tokens on the device."""
    if engine.in_flight is None:
        scheduled = engine.scheduler.schedule()
        if scheduled.is_empty:
            return []
        engine.in_flight = engine._launch(scheduled, None)
    current, engine.in_flight = engine.in_flight, None
    if not may_step_ahead(engine, current):
        return engine._resolve(current, None)
    pending = {seq.seq_id: PENDING_TOKEN for seq in _live(current.batch.seqs)}
    got_token = engine.scheduler.postprocess(live_items(current.scheduled), pending)
    scheduled = engine.scheduler.schedule()
    if not scheduled.is_empty:
        engine.in_flight = engine._launch(scheduled, current)
        engine.async_steps += 1
    return engine._resolve(current, got_token)


def may_step_ahead(engine: LLMEngine, current: DispatchedStep) -> bool:
    """Whether the next step can be planned before ``current``'s tokens are known: no
    sequence needs its tokens on the host to be scheduled or sampled (penalties, grammars,
    LongRoPE's recompute), and none of the sequences ``current`` completes surely ends
    with its token (its length limit), so the next step holds no row that cannot run."""
    scheduler = engine.scheduler
    if scheduler.config.long_rope_threshold is not None:
        return False
    for seq in itertools.chain(scheduler.running, scheduler.waiting):
        if seq.seq_id in engine.grammars.matchers or uses_penalties(seq.params):
            return False
    for seq in _live(current.batch.seqs):
        if seq.num_generated + 1 >= seq.max_tokens or seq.num_tokens + 1 >= engine.max_model_len:
            return False
    return True


def pending_feed(batch: StepBatch, previous: DispatchedStep | None, empty_feed) -> tuple:
    """The runner's ``(from_previous, previous_tokens)`` for ``batch``: for each of its tokens
    the row of ``previous`` that samples it (-1: the token is on the host), and
    ``previous``'s feed (``empty_feed`` when nothing is in flight)."""
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
    feed = empty_feed if previous is None else previous.step.feed
    return from_previous, feed


def fill_pending(got_token: list, tokens: dict) -> list:
    """Puts the sampled ``tokens`` in place of the pending tokens of ``got_token`` (the
    sequences the scheduler advanced before they were read); returns those not ended since."""
    for seq in got_token:
        seq.output_token_ids[-1] = tokens[seq.seq_id]
    return [seq for seq in got_token if not seq.is_finished]


def _live(seqs) -> list:
    """The sequences of a batch's rows that have not ended (padding rows are None)."""
    return [seq for seq in seqs if seq is not None and not seq.is_finished]
