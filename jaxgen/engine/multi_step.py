"""Multi-step decoding (``num_scheduler_steps=N``): when every running sequence decodes, one
call runs N decode steps on the device; the host reads their tokens at once and hands them on
step by step."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax

from jaxgen.engine.dispatched_step import DispatchedStep, live_items
from jaxgen.engine.sampling_tensors import uses_penalties
from jaxgen.engine.scheduler import SchedulerOutput
from jaxgen.engine.step_batch import unpack
from jaxgen.engine.step_layout import StepInputs
from jaxgen.outputs import RequestOutput

if TYPE_CHECKING:
    from jaxgen.engine.llm_engine import LLMEngine


def decode_steps(engine: LLMEngine, scheduled: SchedulerOutput) -> int:
    """How many decode steps the call of ``scheduled`` runs: ``num_scheduler_steps`` when
    every sequence in it decodes, none needs its tokens on the host between them
    (penalties, grammars, LongRoPE, min_tokens still banning stops), each has that many
    tokens left before its length limits, no request waits to be admitted, and the pool
    holds pages for them all (allocated here); else 1."""
    steps = engine.config.num_scheduler_steps
    scheduler = engine.scheduler
    if steps == 1 or scheduler.waiting:
        return 1
    if scheduler.config.long_rope_threshold is not None:
        return 1
    for item in scheduled.scheduled:
        seq = item.seq
        if not item.is_decode or seq.params is None:
            return 1
        if seq.seq_id in engine.grammars.matchers or uses_penalties(seq.params):
            return 1
        if seq.num_generated < seq.params.min_tokens:
            return 1
        if seq.num_generated + steps > seq.max_tokens:
            return 1
        if seq.num_tokens + steps > engine.max_model_len:
            return 1
    for item in scheduled.scheduled:
        if not scheduler.allocator.allocate(item.seq, item.seq.num_computed_tokens + steps):
            return 1
    return steps


def may_run_steps(engine: LLMEngine, inputs: StepInputs) -> bool:
    """Whether a call of ``inputs``' shape can be multi-step (to precompile): a decode-only
    shape when ``num_scheduler_steps`` > 1."""
    return engine.config.num_scheduler_steps > 1 and len(inputs.token_ids) <= engine.layout.seq_cap


def read_steps(engine: LLMEngine, current: DispatchedStep, output) -> list[RequestOutput]:
    """Hands on the tokens of a multi-step call step by step, as that many single steps
    would (stops, finishes); a sequence's tokens after its stop are dropped."""
    outputs = {}
    leaves, treedef = jax.tree_util.tree_flatten(output)  # each [num_steps, S, ...]
    for index in range(current.num_steps):
        scheduled = live_items(current.scheduled)
        if scheduled.is_empty:
            break
        step_output = jax.tree_util.tree_unflatten(treedef, [leaf[index] for leaf in leaves])
        tokens, logprobs = unpack(current.batch, step_output)
        got_token = engine.scheduler.postprocess(scheduled, tokens)
        for out in engine._postprocess(got_token, logprobs):
            outputs[out.request_id] = out
    return list(outputs.values())
