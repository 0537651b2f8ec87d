"""Precompiling an engine: every step shape it can meet, before requests arrive."""

from __future__ import annotations

import time

from jaxgen.engine.compiled import compile_counter
from jaxgen.engine.step.step_batch import precompile_batch


def precompile_engine(engine) -> int:
    """Compiles ``engine``'s (an ``LLMEngine``) step for every batch shape it can meet, and the
    sampler for every row bucket. Every sampling configuration (filters, penalties, logit
    bias, bans, logprobs, prompt logprobs, grammars) runs these same executables. On the native
    CPU and Pallas TPU backends that is every shape (one per token bucket); elsewhere
    decode-only steps (prefill-holding steps compile when first met). With
    ``num_scheduler_steps`` > 1 the multi-step decode calls too; with speculative decoding
    each shape's verify steps (one per verify-row bucket it can carry), and a draft model's
    engine its own steps; with ``kv_offloading_size`` the host tier's page copies. Returns the compiles it took."""
    start = time.perf_counter()
    before = compile_counter.compile_count()
    layout, executor = engine.layout, engine.executor
    multi_step = engine.config.num_scheduler_steps
    for inputs in layout.precompile_shapes():
        batch = precompile_batch(inputs)
        executor.run_now(batch)  # as a step runs: with a feed when async
        if multi_step > 1 and len(inputs.token_ids) <= layout.seq_cap:  # decode-only
            executor.run_now(batch, multi_step)
        if engine.verify_shapes is not None:
            for verify_batch in engine.verify_shapes.padding(batch):
                executor.run_now(verify_batch)
    if engine.runner.page_mover is not None:  # the host KV tier's page copies, every bucket
        engine.runner.precompile_page_moves()
    draft_engine = getattr(getattr(engine.speculator, "proposer", None), "engine", None)
    if draft_engine is not None:  # the draft model's engine (``speculative/draft_model.py``)
        draft_engine.precompile()
    compiles = compile_counter.compile_count() - before
    engine.precompile_compiles += compiles
    engine.precompile_seconds += time.perf_counter() - start
    return compiles
