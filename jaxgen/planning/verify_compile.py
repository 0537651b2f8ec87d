"""Speculative decoding's verify step compiled ahead of time beside the decode step (``jaxgen
plan --target SLICE --compile --num-speculative-tokens k``): ``max_num_seqs`` sequences each
verifying k draft tokens, so B (k + 1) token rows, and the logits of every sampling row and
draft position, B (k + 1) of them, for the step's sampler, as the engine runs it
(``engine/speculative/verify_step.py``: the same jitted step, its logits rows the draft
positions after the sequences' own). The figures are the compiler's counts, not measured
times; the sampler (its own small executable) is not included."""

from __future__ import annotations

import dataclasses
import time
from typing import NamedTuple

import numpy as np

from jaxgen.config.speculative_config import check_num_speculative_tokens
from jaxgen.engine.decoding.speculative.verify_sampling import VerifyShapes
from jaxgen.engine.sampling.sampling_shapes import SamplingShapes
from jaxgen.engine.step.step_layout import StepLayout, spans
from jaxgen.planning.abstract_step import abstract_arrays


class VerifyInputs(NamedTuple):
    """A full verify step's abstract arguments after params and pool."""

    arrays: tuple  # the step's inputs, then its prompt-logprob targets (none)
    sample_rows: int  # the logits rows: every sampling row and draft position, padded
    num_speculative_tokens: int
    token_rows: int  # B (k + 1)


def verify_step_inputs(
    vocab_size: int,
    page_size: int,
    max_num_seqs: int,
    max_model_len: int,
    num_speculative_tokens: int,
    sharding=None,
) -> VerifyInputs:
    """``ShapeDtypeStruct``s of the step of ``max_num_seqs`` sequences each verifying its whole
    draft: B (k + 1) token rows, no prompt logprobs, and as many logits rows (the B sampling
    rows, then the B k draft positions), padded to the engine's row bucket."""
    check_num_speculative_tokens(num_speculative_tokens)
    tokens = max_num_seqs * (num_speculative_tokens + 1)
    layout = StepLayout(
        page_size=page_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=tokens,
        max_model_len=max_model_len,
    )
    inputs = layout.padding_step(tokens, -(-max_model_len // page_size))
    shapes = VerifyShapes(
        SamplingShapes(vocab_size=vocab_size, max_model_len=max_model_len, seq_cap=max_num_seqs),
        tokens,
        max_draft_rows=max_num_seqs * num_speculative_tokens,
    )
    rows = shapes.rows_for(tokens)  # every sequence's sampling row and whole draft
    inputs = dataclasses.replace(
        inputs, logits_indices=np.zeros(rows, np.int32), logits_live=spans((0, 0), (rows, rows))
    )
    targets = np.full(tokens, -1, np.int32)
    return VerifyInputs(
        abstract_arrays((*inputs.arrays, targets), sharding),
        rows,
        num_speculative_tokens,
        tokens,
    )


def compile_verify_step(step, step_params, pool, head, inputs: VerifyInputs) -> dict:
    """Compiles the verify step of ``step`` (the engine's jitted step, under the caller's
    mesh) on the placed ``step_params`` / ``pool`` / ``head``; the compiler's per-chip
    counts for it."""
    start = time.perf_counter()
    lowered = step.trace(
        step_params, pool, *inputs.arrays, head=head, sample_rows=inputs.sample_rows
    ).lower()
    compiled = lowered.compile()
    seconds = time.perf_counter() - start
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return {
        "num_speculative_tokens": inputs.num_speculative_tokens,
        "token_rows": inputs.token_rows,
        "logits_rows": inputs.sample_rows,
        "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
        "flops": float(cost.get("flops", 0.0)),
        "temp": int(compiled.memory_analysis().temp_size_in_bytes),
        "compile_seconds": seconds,
    }


def verify_report_lines(result: dict, decode_step: dict, gb: float) -> list[str]:
    """The verify step's counts beside the decode step's (``compile_decode_step``'s)."""
    verify = result["verify_step"]
    k = verify["num_speculative_tokens"]
    return [
        f"verify step, {result['max_num_seqs']} sequences x {k} draft tokens "
        f"({verify['token_rows']} token rows, {verify['logits_rows']} logits rows; "
        "compiler counts per chip):",
        f"  bytes accessed            {verify['bytes_accessed'] / gb:8.3f} GB  "
        f"({verify['bytes_accessed'] / decode_step['bytes_accessed']:.2f}x the decode step's)",
        f"  flops                     {verify['flops'] / 1e9:8.1f} GFLOP  "
        f"({verify['flops'] / max(decode_step['flops'], 1.0):.2f}x the decode step's)",
        f"  compiler temporaries      {verify['temp'] / gb:8.3f} GB",
        f"  tokens per weight read    up to {k + 1} (every draft accepted) against 1",
        f"compiled in {verify['compile_seconds']:.1f} s",
    ]
