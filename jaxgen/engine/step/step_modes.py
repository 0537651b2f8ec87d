"""The engine's plain and asynchronous step modes, composed of ``LLMEngine``'s public stages
(``launch``, ``read``, ``postprocess``); speculative verify is ``speculative.verify_step``,
beam search ``beam_search``. ``LLMEngine.step_mode`` picks one per step."""

from __future__ import annotations

from jaxgen.engine.scheduling.multi_step import decode_steps_for, may_step_ahead
from jaxgen.engine.step.executor import PENDING_TOKEN
from jaxgen.outputs import RequestOutput


def plain_step(engine) -> list[RequestOutput]:
    """Schedule, launch, read, postprocess; with ``num_scheduler_steps`` > 1 one call may run
    that many decode steps (``scheduling.multi_step.decode_steps_for``)."""
    scheduled = engine.scheduler.schedule()
    if scheduled.is_empty:
        return []
    num_steps = decode_steps_for(
        engine.scheduler,
        scheduled,
        engine.config.num_scheduler_steps,
        grammars=engine.grammars.matchers,
        max_model_len=engine.max_model_len,
    )
    current = engine.launch(scheduled, num_steps)
    return engine.postprocess(engine.read(current), current)


def step_ahead(engine) -> list[RequestOutput]:
    """Asynchronous scheduling: launches the next step (if the one in flight allows it), then
    reads the one in flight, and returns its outputs.

    The step in flight has not told the host its tokens: each sequence it completes gets a
    ``PENDING_TOKEN`` in their place, so the scheduler can plan the next step (pages,
    positions) and the next step's rows take the real tokens on the device."""
    executor, scheduler = engine.executor, engine.scheduler
    if executor.in_flight is None:
        scheduled = scheduler.schedule()
        if scheduled.is_empty:
            return []
        executor.hold(engine.launch(scheduled))
    current = executor.take()
    ahead = may_step_ahead(
        scheduler,
        current,
        grammars=engine.grammars.matchers,
        max_model_len=engine.max_model_len,
    )
    if engine.speculator is not None:  # a sequence about to draft needs its token first
        ahead = ahead and not engine.speculator.may_draft(current.live_seqs())
    if not ahead:
        return engine.postprocess(engine.read(current), current)
    pending = {seq.seq_id: PENDING_TOKEN for seq in current.live_seqs()}
    got_token = scheduler.postprocess(current.live_items(), pending)
    scheduled = scheduler.schedule()
    if not scheduled.is_empty:
        executor.hold(engine.launch(scheduled, after=current))
        engine.async_steps += 1
    return engine.postprocess(engine.read(current), current, got_token)
