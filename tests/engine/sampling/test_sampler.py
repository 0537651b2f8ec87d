"""Tests for jaxgen.engine.sampling.sampler: batched on-device sampling with per-request parameters.

Most tests run their rows next to the SENTINEL row of ``tests/engine/sampling/sampler_checks.py``, which
turns every feature on, so they share one compiled function (compiling the sampling path takes
seconds on CPU). The host side: ``test_sampling_tensors.py``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from jaxgen.engine.sampling import sampler, sampling_cutoff
from jaxgen.engine.sampling.sampler import sample
from jaxgen.engine.sampling.sampling_tensors import (
    SamplingRow,
    build_sampling_tensors,
)
from jaxgen.sampling_params import SamplingParams
from tests.engine.sampling.sampler_checks import (
    ALL_ON,
    BATCH,
    FAST,
    ROWS,
    VOCAB,
    _apply_penalties_jit,
    _filter_cutoff_jit,
    _log_softmax,
    _peaked_logits,
    _random_logits,
    _reference_filter,
    _rows,
    _run,
    _run_alone,
    _sample_jit,
    _shared_inputs,
)

# --------------------------------------------------------------------------------------------
# Greedy, seeds, distributions
# --------------------------------------------------------------------------------------------


def test_greedy_equals_argmax():
    logits = _random_logits(0)
    greedy = _rows([SamplingParams(temperature=0.0)] * ROWS)
    alone = _run_alone(logits, greedy, ROWS)  # the all-greedy fast path
    np.testing.assert_array_equal(alone.token_ids, logits.argmax(-1))
    # Greedy rows stay the exact argmax in a batch that also samples.
    np.testing.assert_array_equal(_run(logits, greedy).token_ids, logits.argmax(-1))


def test_blocked_argmax_is_numpys_first_maximum():
    """The greedy argmax in blocks: the first maximum, across and within blocks, as numpy's
    (a NaN counts as the largest), for vocabularies a block divides, one with a padded last
    block, and one smaller than a block."""
    rng = np.random.default_rng(5)
    for vocab in (49152, 1000, 100):
        values = rng.standard_normal((7, vocab)).astype(np.float32)
        values[1, [3, vocab - 1]] = 9.0  # a tie across blocks: the first
        values[2, [vocab - 2, vocab - 1]] = 9.0  # a tie in the last (padded) block
        values[3] = -np.inf  # nothing allowed: 0, as numpy
        values[4, vocab // 2] = np.nan
        values[5, :] = 1.0  # all equal: 0
        values[6, vocab - 1] = 50.0
        values[0, [5, 6]] = [-np.inf, np.inf]  # a block whose sum is NaN without a NaN
        actual = np.asarray(jax.jit(sampler._argmax)(jnp.asarray(values)))
        np.testing.assert_array_equal(actual, np.argmax(values, axis=-1))


@FAST
@given(temperature=st.floats(0.05, 100.0), seed=st.integers(0, 2**31))
def test_top_k_one_equals_greedy(temperature, seed):
    logits = _random_logits(seed % 7)
    params = SamplingParams(temperature=temperature, top_k=1, seed=seed)
    out = _run(logits, _rows([params] * ROWS))
    np.testing.assert_array_equal(out.token_ids, logits.argmax(-1))

    # The device treats top_k == 1 as greedy too, even if the host did not.
    unfiltered = _rows([SamplingParams(temperature=temperature, seed=seed)] * ROWS)
    padded, tensors, flags = _shared_inputs(logits, unfiltered)
    tensors = dataclasses.replace(tensors, top_k=np.where(np.arange(BATCH) < ROWS, 1, 3))
    tokens = np.asarray(_sample_jit(padded, tensors, flags).token_ids)[:ROWS]
    np.testing.assert_array_equal(tokens, logits.argmax(-1))


def test_same_seed_same_tokens_whatever_the_batch():
    steps = 12
    target = SamplingParams(temperature=1.3, top_p=0.95, min_p=0.001, seed=1234)
    target_logits = _random_logits(1, (VOCAB,), scale=1.0)  # high entropy: draws differ by key
    others = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8, top_k=300),  # needs the exact fallback
        SamplingParams(temperature=3.0, top_p=0.5),  # flat: needs the exact fallback
        SamplingParams(temperature=0.9, repetition_penalty=1.3, frequency_penalty=0.5),
        SamplingParams(temperature=0.5, top_k=5, seed=99, logprobs=4),
    ]

    def batch(target_positions, num_rows):
        rows, logits = [], []
        for index in range(num_rows):
            if index in target_positions:
                step = target_positions.index(index)
                rows.append(SamplingRow(target, [1, 2], list(range(step)), []))
                logits.append(target_logits)
            else:
                rows.append(SamplingRow(others[index % len(others)], [3, 4], [5, 6, 5], [7]))
                logits.append(_random_logits(index, (VOCAB,), scale=2.0))
        return np.stack(logits), rows

    alone = _run_alone(*batch(list(range(steps)), steps), steps).token_ids
    positions = [ROWS - 1 - 2 * i for i in range(steps)]  # reversed, interleaved with others
    mixed = _run(*batch(positions, ROWS), step_counter=5).token_ids[positions]
    np.testing.assert_array_equal(alone, mixed)
    assert len(set(alone.tolist())) > steps // 2  # the steps really draw different tokens


def test_different_seeds_differ():
    logits = np.zeros((ROWS, VOCAB), np.float32)
    seeded = [SamplingParams(seed=seed) for seed in range(ROWS)]
    assert len(set(_run(logits, _rows(seeded)).token_ids.tolist())) > ROWS - 5
    # One seed, successive steps.
    same_seed = _rows([SamplingParams(seed=5)] * ROWS, output_lengths=list(range(ROWS)))
    assert len(set(_run(logits, same_seed).token_ids.tolist())) > ROWS - 5
    # Unseeded rows differ between rows and between engine steps.
    unseeded = _rows([SamplingParams()] * ROWS)
    first = _run(logits, unseeded, step_counter=0).token_ids
    second = _run(logits, unseeded, step_counter=1).token_ids
    assert len(set(first.tolist())) > ROWS - 5
    assert (first != second).mean() > 0.8


def _draw_many(row_logits, params, num_samples):
    """``num_samples`` tokens for one row of logits, varying the seed."""
    tokens = []
    for first_seed in range(0, num_samples, ROWS):
        rows = _rows([dataclasses.replace(params, seed=first_seed + i) for i in range(ROWS)])
        tokens.append(_run(np.tile(row_logits, (ROWS, 1)), rows).token_ids)
    return np.concatenate(tokens)[:num_samples]


def _chi_square(counts, expected_probs):
    expected = expected_probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_temperature_sampling_matches_softmax():
    row = np.full(VOCAB, -np.inf, np.float32)
    row[:8] = [1.0, 0.5, 0.0, -0.5, 2.0, -1.0, 0.3, 1.5]
    tokens = _draw_many(row, SamplingParams(temperature=0.7), ROWS * 100)
    counts = np.bincount(tokens, minlength=VOCAB)
    assert counts[8:].sum() == 0
    expected = np.exp(_log_softmax(row[:8] / 0.7))
    assert _chi_square(counts[:8], expected) < 30.0  # 7 degrees of freedom; p ~ 1e-4


def test_two_level_sampling_matches_softmax_across_blocks():
    num_samples = 4096
    row = np.full(VOCAB, -30.0, np.float32)
    hot = np.array([3, 200, 257, 511, 700, 1023])  # spread over the 256-wide blocks
    row[hot] = [0.0, 0.5, 1.0, -0.5, 0.2, 0.8]
    keys = jax.random.split(jax.random.key(0), num_samples)
    tokens = np.asarray(sampler._two_level_gumbel_max(jnp.tile(row, (num_samples, 1)), keys))
    assert np.isin(tokens, hot).all()
    counts = np.array([(tokens == token).sum() for token in hot])
    expected = np.exp(_log_softmax(row[hot]))
    assert _chi_square(counts, expected) < 25.0  # 5 degrees of freedom


def test_filtered_sampling_matches_renormalised_softmax():
    row = _peaked_logits(3, (VOCAB,))
    params = SamplingParams(temperature=0.8, top_k=6, top_p=0.95)
    tokens = _draw_many(row, params, ROWS * 100)
    scaled = row / np.float32(0.8)
    keep, ambiguous = _reference_filter(scaled, 6, 0.95, 0.0)
    assert not ambiguous.any()
    kept = np.flatnonzero(keep)
    assert np.isin(tokens, kept).all()
    counts = np.array([(tokens == token).sum() for token in kept])
    expected = np.exp(_log_softmax(scaled[kept]))
    assert _chi_square(counts, expected) < 4.0 * len(kept) + 15.0


# --------------------------------------------------------------------------------------------
# Filters and bans
# --------------------------------------------------------------------------------------------


@FAST
@example(seed=1, flat=True, temperature=1.0, top_k=0, top_p=0.95, min_p=0.0)  # exact fallback
@example(seed=2, flat=False, temperature=1.0, top_k=600, top_p=1.0, min_p=0.0)  # exact fallback
@given(
    seed=st.integers(0, 1000),
    flat=st.booleans(),
    temperature=st.floats(0.2, 3.0),
    top_k=st.sampled_from([0, 0, 2, 40, 256, 257, 600]),
    top_p=st.sampled_from([1.0, 1.0, 0.3, 0.8, 0.95, 0.99]),
    min_p=st.sampled_from([0.0, 0.0, 0.05, 0.3]),
)
def test_filters_never_sample_removed_tokens(seed, flat, temperature, top_k, top_p, min_p):
    logits = _random_logits(seed, scale=0.5) if flat else _peaked_logits(seed)
    params = [
        SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=s)
        for s in range(ROWS)
    ]
    tokens = _run(logits, _rows(params)).token_ids
    for row, token in zip(logits, tokens, strict=True):
        keep, ambiguous = _reference_filter(row / np.float32(temperature), top_k, top_p, min_p)
        assert keep[token] or ambiguous[token]


@FAST
@example(seed=1, flat=True, top_k=0, top_p=0.95, min_p=0.0)  # nucleus past the candidates
@example(seed=2, flat=True, top_k=600, top_p=0.999, min_p=0.0)  # both bisections
@example(seed=3, flat=False, top_k=257, top_p=1.0, min_p=0.3)  # top_k bisection, then min_p
@given(
    seed=st.integers(0, 1000),
    flat=st.booleans(),
    top_k=st.sampled_from([0, 1, 3, 40, 255, 256, 257, 600, VOCAB - 1, VOCAB]),
    top_p=st.sampled_from([1.0, 0.2, 0.8, 0.95, 0.999]),
    min_p=st.sampled_from([0.0, 0.01, 0.3]),
)
def test_filter_cutoff_matches_full_sort_reference(seed, flat, top_k, top_p, min_p):
    """Candidate path and exact bisection fallback both give vLLM's kept set."""
    scaled = _random_logits(seed, scale=0.5) if flat else _peaked_logits(seed)
    tensors, _ = build_sampling_tensors(
        _rows([SamplingParams()] * ROWS), ROWS, base_seed=0, step_counter=0
    )
    tensors = dataclasses.replace(
        tensors,
        top_k=np.full(ROWS, top_k, np.int32),
        top_p=np.full(ROWS, top_p, np.float32),
        min_p=np.full(ROWS, min_p, np.float32),
    )
    cutoff = np.asarray(_filter_cutoff_jit(scaled, tensors, ALL_ON, jnp.zeros(ROWS, bool)))
    for row, row_cutoff in zip(scaled, cutoff, strict=True):
        keep, ambiguous = _reference_filter(row, top_k, top_p, min_p, tolerance=1e-5)
        if ambiguous.any():
            continue
        np.testing.assert_array_equal(row >= row_cutoff, keep)


def test_banned_tokens_never_sampled():
    logits = _peaked_logits(5)
    top_two = np.argsort(-logits, axis=-1)[:, :2]
    params = [SamplingParams(temperature=0.0 if i % 3 == 0 else 1.5, seed=i) for i in range(ROWS)]
    rows = [
        SamplingRow(p, [1], [], banned.tolist()) for p, banned in zip(params, top_two, strict=True)
    ]
    tokens = _run(logits, rows).token_ids
    assert not (tokens[:, None] == top_two).any()
    np.testing.assert_array_equal(tokens[::3], np.argsort(-logits, axis=-1)[::3, 2])

    # Long ban lists take the scatter path.
    banned = np.argsort(-logits, axis=-1)[:, :40]
    rows = [SamplingRow(p, [1], [], ids.tolist()) for p, ids in zip(params, banned, strict=True)]
    tokens = _run_alone(logits, rows, ROWS).token_ids
    assert not (tokens[:, None] == banned).any()


# --------------------------------------------------------------------------------------------
# Penalties and logprobs
# --------------------------------------------------------------------------------------------


def _reference_penalties(logits, prompt, output, repetition, presence, frequency):
    logits = np.array(logits, np.float64)
    for row in range(logits.shape[0]):
        seen = {t for t in list(prompt[row]) + list(output[row]) if t >= 0}
        for token in seen:
            value = logits[row, token]
            logits[row, token] = value / repetition[row] if value > 0 else value * repetition[row]
        tokens, counts = np.unique(
            np.array([t for t in output[row] if t >= 0], np.int64), return_counts=True
        )
        logits[row, tokens] -= frequency[row] * counts + presence[row]
    return logits


@FAST
@given(
    seed=st.integers(0, 10_000),
    repetition=st.floats(0.5, 2.0),
    presence=st.floats(-2.0, 2.0),
    frequency=st.floats(-2.0, 2.0),
)
def test_penalties_match_numpy(seed, repetition, presence, frequency):
    rng = np.random.default_rng(seed)
    batch = 4
    logits = rng.standard_normal((batch, VOCAB)).astype(np.float32)
    # At most 16 tokens each (one shape bucket); output ids from a small range, so they repeat.
    prompt = [rng.integers(0, VOCAB, rng.integers(1, 17)).tolist() for _ in range(batch)]
    output = [rng.integers(0, 12, rng.integers(0, 17)).tolist() for _ in range(batch)]
    params = [
        SamplingParams(
            temperature=0.0,
            repetition_penalty=repetition,
            presence_penalty=presence,
            frequency_penalty=frequency,
        )
        for _ in range(batch - 1)
    ]
    params.append(SamplingParams(temperature=0.0, frequency_penalty=0.7))  # only frequency
    rows = [SamplingRow(*fields, []) for fields in zip(params, prompt, output, strict=True)]
    padded, tensors, flags = _shared_inputs(logits, rows)
    history = (
        tensors.prompt_token_ids,
        tensors.output_token_ids,
        tensors.repetition_penalty,
        tensors.presence_penalty,
        tensors.frequency_penalty,
    )
    got = np.asarray(_apply_penalties_jit(padded, *history))
    expected = _reference_penalties(np.asarray(padded), *history)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # Greedy rows take the argmax of the penalised logits.
    tokens = np.asarray(_sample_jit(padded, tensors, flags).token_ids)
    np.testing.assert_array_equal(tokens[:batch], expected[:batch].argmax(-1))


def test_logprobs_are_raw_log_softmax():
    logits = _random_logits(9)
    params = [
        SamplingParams(
            temperature=0.0 if i % 2 else 0.7,
            top_k=20,
            repetition_penalty=1.5,
            seed=i,
            logprobs=None if i % 4 == 3 else 5,
        )
        for i in range(ROWS)
    ]
    rows = [SamplingRow(p, [1, 2], [3, 4], [5]) for p in params]
    out = _run(logits, rows)
    reference = _log_softmax(logits)
    assert out.top_token_ids.shape == out.top_logprobs.shape == (ROWS, 5)
    np.testing.assert_allclose(
        out.logprobs, reference[np.arange(ROWS), out.token_ids], atol=1e-4, rtol=0
    )
    np.testing.assert_array_equal(out.top_token_ids, np.argsort(-logits, axis=-1)[:, :5])
    np.testing.assert_allclose(
        out.top_logprobs, np.take_along_axis(reference, out.top_token_ids, -1), atol=1e-4, rtol=0
    )
    assert (np.diff(out.top_logprobs, axis=-1) <= 0).all()

    sampled_only = _rows([SamplingParams(temperature=0.0, logprobs=0)] * ROWS)
    sampled_only = _run_alone(logits, sampled_only, ROWS)
    assert sampled_only.top_token_ids.shape == sampled_only.top_logprobs.shape == (ROWS, 0)
    np.testing.assert_allclose(sampled_only.logprobs, reference.max(-1), atol=1e-4, rtol=0)
    # No row asks for logprobs: the normaliser is skipped, the (unread) logprobs are zeros.
    no_logprobs = _run_alone(logits, _rows([SamplingParams(temperature=0.0)] * ROWS), ROWS)
    np.testing.assert_array_equal(no_logprobs.token_ids, sampled_only.token_ids)
    np.testing.assert_array_equal(no_logprobs.logprobs, np.zeros(ROWS, np.float32))


# --------------------------------------------------------------------------------------------
# Compilation
# --------------------------------------------------------------------------------------------


def test_jit_compiles_once_per_flags_combination():
    traced = []

    def step(logits, tensors, flags):
        traced.append(flags)
        return sample(logits, tensors, flags)

    step_jit = jax.jit(step, static_argnames="flags")
    logits = jnp.asarray(_random_logits(0, (8, 64)))

    def call(params_list, step_counter):
        tensors, flags = build_sampling_tensors(
            _rows(params_list), 8, base_seed=0, step_counter=step_counter
        )
        step_jit(logits, tensors, flags).token_ids.block_until_ready()

    # Greedy variants keep this test cheap; the flags are static arguments all the same.
    for counter in range(3):  # new values, same flags and shapes: one trace
        call([SamplingParams(temperature=0.0, seed=counter)] * (counter + 1), counter)
    assert len(traced) == 1
    call([SamplingParams(temperature=0.0, logprobs=2)], 3)  # new flags
    call([SamplingParams(temperature=0.0, presence_penalty=0.5)], 4)  # new flags and shapes
    call([SamplingParams(temperature=0.0)] * 2, 5)  # the first flags again: cached
    assert len(traced) == 3
    assert len(set(traced)) == 3


def test_ordered_keys_preserve_float_order():
    values = jnp.array([-jnp.inf, -3e38, -1.5, -1e-40, -0.0, 0.0, 1e-40, 2.0, 3e38, jnp.inf])
    keys = np.asarray(sampling_cutoff._float_to_ordered(values))
    assert (np.diff(keys.astype(np.int64)) >= 0).all()
    np.testing.assert_array_equal(
        np.asarray(sampling_cutoff._ordered_to_float(jnp.asarray(keys))), values
    )
