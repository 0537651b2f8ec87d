"""The sampler tests' shared configuration: a batch whose SENTINEL row turns every feature on,
so the tests share one compiled function (compiling the sampling path takes seconds on CPU),
the jitted entry points, and pure-numpy references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import settings

from jaxgen.engine.sampling import sampler
from jaxgen.engine.sampling.logit_processors import apply_penalties
from jaxgen.engine.sampling.sampler import sample
from jaxgen.engine.sampling.sampling_tensors import (
    SamplerOutput,
    SamplingFlags,
    SamplingRow,
    build_sampling_tensors,
)
from jaxgen.sampling_params import SamplingParams

VOCAB = 1024  # > MAX_CANDIDATES, so both the candidate path and the exact fallback are reachable
BATCH = 32
ROWS = BATCH - 1  # rows a test controls in the shared configuration
FAST = settings(max_examples=15, deadline=None, derandomize=True, database=None)
SENTINEL = SamplingRow(
    SamplingParams(
        temperature=1.0,
        top_k=3,
        top_p=0.9,
        min_p=0.01,
        repetition_penalty=1.1,
        presence_penalty=0.1,
        frequency_penalty=0.1,
        logprobs=5,
        seed=0,
    ),
    [1, 2],
    [3],
    [4],
)
ALL_ON = SamplingFlags(False, True, True, True, True, 5)

_sample_jit = jax.jit(sample, static_argnames="flags")
_filter_cutoff_jit = jax.jit(sampler._filter_cutoff, static_argnums=2)
_apply_penalties_jit = jax.jit(apply_penalties)


def _shared_inputs(logits, rows, *, step_counter=0):
    """Rows (<= ROWS; histories <= 16, bans <= 4, logprobs <= 5) + SENTINEL, padded to BATCH."""
    assert len(rows) <= ROWS
    padded = np.zeros((BATCH, VOCAB), np.float32)
    padded[: len(rows)] = logits
    tensors, flags = build_sampling_tensors(
        [*rows, SENTINEL], BATCH, base_seed=0, step_counter=step_counter
    )
    assert flags == ALL_ON
    assert tensors.prompt_token_ids.shape[1] == tensors.output_token_ids.shape[1] == 16
    assert tensors.banned_token_ids.shape[1] == 4
    return jnp.asarray(padded), tensors, flags


def _run(logits, rows, *, step_counter=0) -> SamplerOutput:
    """Sample ``rows`` in the shared configuration; returns their rows of the output."""
    out = _sample_jit(*_shared_inputs(logits, rows, step_counter=step_counter))
    return jax.tree.map(lambda array: np.asarray(array)[: len(rows)], out)


def _run_alone(logits, rows, batch_size, *, step_counter=0) -> SamplerOutput:
    """Sample ``rows`` on their own (their own flags and shapes)."""
    tensors, flags = build_sampling_tensors(
        rows, batch_size, base_seed=0, step_counter=step_counter
    )
    return jax.tree.map(np.asarray, _sample_jit(jnp.asarray(logits), tensors, flags))


def _rows(params_list, output_lengths=None):
    output_lengths = output_lengths or [0] * len(params_list)
    return [
        SamplingRow(params, [1, 2, 3], list(range(5, 5 + length)), [])
        for params, length in zip(params_list, output_lengths, strict=True)
    ]


def _random_logits(seed, shape=(ROWS, VOCAB), scale=3.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _peaked_logits(seed, shape=(ROWS, VOCAB)):
    """LLM-like logits: probabilities fall off like rank**-2, so nuclei are small."""
    rng = np.random.default_rng(seed)
    ranks = np.argsort(rng.random(shape), axis=-1)
    return (-2.0 * np.log1p(ranks) + 0.3 * rng.standard_normal(shape)).astype(np.float32)


def _log_softmax(logits):
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def _reference_filter(scaled_row, top_k, top_p, min_p, tolerance=1e-4):
    """vLLM's top_k -> top_p -> min_p on one row of scaled logits (float64, full sort).

    Returns (kept mask, ambiguous mask): ambiguous tokens sit within ``tolerance`` of the top_p
    or min_p boundary, where float32 rounding may legitimately decide either way.
    """
    values = np.asarray(scaled_row, np.float64)
    vocab = values.size
    order = np.argsort(-values, kind="stable")
    keep = np.ones(vocab, bool)
    ambiguous = np.zeros(vocab, bool)
    if 0 < top_k < vocab:
        keep[order[top_k:]] = False
    if top_p < 1.0:
        kept_order = order[keep[order]]
        probs = np.exp(values[kept_order] - values[kept_order].max())
        probs /= probs.sum()
        mass_before = np.concatenate([[0.0], np.cumsum(probs)[:-1]])
        keep[kept_order[mass_before >= top_p]] = False
        ambiguous[kept_order[np.abs(mass_before - top_p) < tolerance]] = True
    if min_p > 0.0:
        threshold = values.max() + np.log(min_p)
        keep &= values >= threshold
        ambiguous |= np.abs(values - threshold) < tolerance
    return keep, ambiguous
