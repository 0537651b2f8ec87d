"""The engine's shape-stable sampling (jaxgen.engine.sampling.sampling_shapes): every sampling
configuration fits one shape per row bucket, samples with every stage on, and gives the tokens
the batch's own flags and widths give."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgen.engine.sampling.sampler import sample
from jaxgen.engine.sampling.sampling_shapes import GENERAL_FLAGS, SamplingShapes, row_buckets
from jaxgen.engine.sampling.sampling_tensors import SamplingRow, build_sampling_tensors
from jaxgen.sampling_params import SamplingParams

VOCAB = 1024
SHAPES = SamplingShapes(vocab_size=VOCAB, max_model_len=64, seq_cap=16)
TRACES: list[object] = []


def _general(logits, tensors):
    TRACES.append(None)  # once per trace: the tests count executables
    return sample(logits, tensors, GENERAL_FLAGS)


_general_jit = jax.jit(_general)
_specific_jit = jax.jit(sample, static_argnames="flags")

CONFIGS = {
    "greedy": [SamplingRow(SamplingParams(temperature=0.0))] * 3,
    "sampled": [
        SamplingRow(SamplingParams(temperature=0.8, seed=1)),
        SamplingRow(SamplingParams(temperature=1.2, top_k=7, top_p=0.9, seed=2)),
        SamplingRow(SamplingParams(temperature=1.0, min_p=0.05, seed=3)),
        SamplingRow(SamplingParams(temperature=1.0, top_k=400, seed=4)),  # exact fallback
    ],
    "penalties": [
        SamplingRow(SamplingParams(temperature=0.0, repetition_penalty=1.5), [1, 2, 3], [4, 4]),
        SamplingRow(SamplingParams(temperature=0.7, frequency_penalty=1.0, seed=5), [9], [8, 8]),
        SamplingRow(SamplingParams(temperature=0.0)),
    ],
    "bias and logprobs": [
        SamplingRow(SamplingParams(temperature=0.0, logit_bias={3: 100.0}, logprobs=5)),
        SamplingRow(SamplingParams(temperature=0.0, logprobs=0)),
        SamplingRow(SamplingParams(temperature=0.9, seed=6, logprobs=20)),
    ],
    "bans": [  # min_tokens bans (stop ids and EOS): folded into the bitmask
        SamplingRow(SamplingParams(temperature=0.0), banned_token_ids=[0, 1, 2, 5, 31, 32, 33]),
        SamplingRow(SamplingParams(temperature=0.0)),
        SamplingRow(SamplingParams(temperature=1.0, seed=7), banned_token_ids=list(range(40))),
    ],
}


def _logits(rows: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((rows, VOCAB)) * 3).astype(np.float32)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fitted_batch_samples_as_its_own_flags_do(name):
    rows = CONFIGS[name]
    logits = _logits(len(rows))
    tensors, flags = build_sampling_tensors(rows, len(rows), base_seed=0, step_counter=3)
    own = jax.tree.map(np.asarray, _specific_jit(jnp.asarray(logits), tensors, flags))
    fitted = SHAPES.fit(tensors)
    padded = np.zeros((fitted.temperature.shape[0], VOCAB), np.float32)
    padded[: len(rows)] = logits
    general = jax.tree.map(np.asarray, _general_jit(jnp.asarray(padded), fitted))
    np.testing.assert_array_equal(general.token_ids[: len(rows)], own.token_ids)
    np.testing.assert_allclose(general.logprobs[: len(rows)], own.logprobs, atol=1e-5)
    for row, params in enumerate(row.params for row in rows):
        k = params.logprobs or 0
        np.testing.assert_array_equal(general.top_token_ids[row, :k], own.top_token_ids[row, :k])
    for row, sampling_row in enumerate(rows):
        assert general.token_ids[row] not in set(sampling_row.banned_token_ids)


def test_every_configuration_shares_one_executable_per_row_bucket():
    TRACES.clear()
    shapes = set()
    for rows in CONFIGS.values():
        tensors, _ = build_sampling_tensors(rows, len(rows), base_seed=0, step_counter=0)
        fitted = SHAPES.fit(tensors)
        shapes.add(jax.tree.map(lambda leaf: (leaf.shape, leaf.dtype), fitted))
        padded = jnp.zeros((fitted.temperature.shape[0], VOCAB), jnp.float32)
        _general_jit(padded, fitted).token_ids.block_until_ready()
    assert len(shapes) == 1 and len(TRACES) <= 1  # 0 if an earlier test traced it already


def test_row_buckets_cover_every_step():
    assert row_buckets(64) == (4, 16, 64)
    assert row_buckets(16) == (4, 16) and row_buckets(2) == (2,) and row_buckets(32) == (4, 16, 32)
    assert [SHAPES.rows_for(rows) for rows in (1, 2, 4, 5, 16)] == [4, 4, 4, 16, 16]


def test_bans_become_forbidden_bits():
    rows = [
        SamplingRow(SamplingParams(), banned_token_ids=[0, 33, VOCAB - 1]),
        SamplingRow(SamplingParams()),
    ]
    tensors, _ = build_sampling_tensors(rows, 2, base_seed=0, step_counter=0)
    fitted = SHAPES.fit(tensors)
    bits = np.unpackbits(np.asarray(fitted.token_bitmask).view(np.uint8), bitorder="little")
    bits = bits.reshape(fitted.temperature.shape[0], -1)
    assert list(np.flatnonzero(bits[0] == 0)) == [0, 33, VOCAB - 1]
    assert bits[1].all() and list(np.asarray(fitted.constrained)[:2]) == [True, False]
