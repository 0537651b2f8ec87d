"""Tests for jaxgen.engine.sampling.sampling_tensors: the host side of sampling (padding and buckets,
histories, greedy and seeds decided on the host, ``min_tokens`` bans)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from jaxgen.engine.sampling.sampling_tensors import (
    SamplingFlags,
    SamplingRow,
    SamplingTensors,
    build_sampling_tensors,
    concat_rows,
    min_tokens_banned_ids,
    take_rows,
)
from jaxgen.sampling_params import SamplingParams
from tests.engine.sampling.sampler_checks import _rows

# --------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------


def test_build_sampling_tensors_pads_and_buckets():
    rows = [
        SamplingRow(SamplingParams(temperature=0.7, top_k=40, seed=7), [1, 2], [3], [9]),
        (SamplingParams(temperature=0.0, repetition_penalty=1.2), list(range(20)), [4, 5], []),
        SamplingRow(SamplingParams(top_p=0.5, min_p=0.1, logprobs=3), [1], [], [2, 3]),
    ]
    tensors, flags = build_sampling_tensors(rows, 8, base_seed=3, step_counter=11)

    assert flags == SamplingFlags(
        all_greedy=False,
        any_top_k=True,
        any_top_p=True,
        any_min_p=True,
        any_penalties=True,
        num_logprobs=3,
    )
    hash(flags)
    assert len(jax.tree.leaves(tensors)) == len(dataclasses.fields(SamplingTensors))
    np.testing.assert_allclose(tensors.temperature, [0.7, 0, 1, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(tensors.top_k, [40, 0, 0, 0, 0, 0, 0, 0])
    np.testing.assert_allclose(tensors.top_p, [1, 1, 0.5, 1, 1, 1, 1, 1])
    np.testing.assert_array_equal(tensors.steps, [1, 2, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(tensors.has_seed, [True] + [False] * 7)
    assert tensors.seeds.dtype == np.uint32 and tensors.seeds[0] == 7
    # Ban lists padded to a power-of-two width with -1.
    assert tensors.banned_token_ids.shape == (8, 4)
    np.testing.assert_array_equal(tensors.banned_token_ids[2], [2, 3, -1, -1])
    # Only the penalised row carries its history; widths are power-of-two buckets.
    assert tensors.prompt_token_ids.shape == (8, 32)
    assert tensors.output_token_ids.shape == (8, 16)
    np.testing.assert_array_equal(tensors.prompt_token_ids[1, :20], np.arange(20))
    assert (tensors.prompt_token_ids[[0, 2, 3]] == -1).all()
    np.testing.assert_array_equal(tensors.output_token_ids[1, :3], [4, 5, -1])


def test_build_without_penalties_or_bans_has_empty_histories():
    rows = _rows([SamplingParams(temperature=0.0)] * 3)
    tensors, flags = build_sampling_tensors(rows, 4, base_seed=0, step_counter=0)
    assert flags == SamplingFlags()
    assert tensors.prompt_token_ids.shape == (4, 0)
    assert tensors.output_token_ids.shape == (4, 0)
    assert tensors.banned_token_ids.shape == (4, 0)


def test_top_k_one_and_tiny_temperature_are_greedy_on_host():
    rows = _rows([SamplingParams(temperature=2.0, top_k=1), SamplingParams(temperature=1e-7)])
    tensors, flags = build_sampling_tensors(rows, 2, base_seed=0, step_counter=0)
    assert flags.all_greedy
    np.testing.assert_array_equal(tensors.temperature, [0.0, 0.0])


def test_seeds_on_host():
    seeded = SamplingParams(seed=2**40 + 5)
    unseeded = SamplingParams()
    first, _ = build_sampling_tensors(_rows([seeded, unseeded]), 2, base_seed=1, step_counter=0)
    moved, _ = build_sampling_tensors(_rows([unseeded, seeded]), 2, base_seed=1, step_counter=0)
    later, _ = build_sampling_tensors(_rows([seeded, unseeded]), 2, base_seed=1, step_counter=1)
    again, _ = build_sampling_tensors(_rows([seeded, unseeded]), 2, base_seed=1, step_counter=0)
    assert first.seeds[0] == moved.seeds[1] == later.seeds[0]
    assert first.seeds[1] != later.seeds[1]  # unseeded rows change between steps
    assert first.seeds[1] == again.seeds[1]  # ... deterministically
    assert first.seeds[1] != moved.seeds[0]  # ... and between rows


def test_build_rejects_too_many_rows():
    with pytest.raises(ValueError):
        build_sampling_tensors(_rows([SamplingParams()] * 3), 2, base_seed=0, step_counter=0)


def test_min_tokens_banned_ids():
    params = SamplingParams(min_tokens=3, stop_token_ids=[7, 5])
    assert min_tokens_banned_ids(params, 0, [2]) == [2, 5, 7]
    assert min_tokens_banned_ids(params, 3, [2]) == []
    ignore_eos = SamplingParams(min_tokens=3, stop_token_ids=[7], ignore_eos=True)
    assert min_tokens_banned_ids(ignore_eos, 1, [2]) == [7]


def test_rows_of_two_batches_concatenate_at_the_wider_widths():
    """A verify step's sampling rows: the step's own rows, then its draft positions' (their
    penalty histories, bans and logit biases of other widths)."""
    penalised = SamplingParams(temperature=0.0, repetition_penalty=1.2, logit_bias={5: 2.0})
    first, _ = build_sampling_tensors(
        [SamplingRow(penalised, list(range(20)), [4, 5], [])], 2, base_seed=0, step_counter=0
    )
    second, _ = build_sampling_tensors(
        [SamplingRow(SamplingParams(top_k=3), [1], [], [7])], 1, base_seed=0, step_counter=0
    )
    both = concat_rows(take_rows(first, 1), second)
    assert both.temperature.tolist() == [0.0, second.temperature[0]]
    assert both.top_k.tolist() == [0, 3]
    for name, fill in [("prompt_token_ids", -1), ("logit_bias_values", 0.0)]:
        wide, narrow = getattr(first, name), getattr(second, name)
        assert getattr(both, name).shape == (2, max(wide.shape[1], narrow.shape[1]))
        np.testing.assert_array_equal(getattr(both, name)[0, : wide.shape[1]], wide[0])
        assert (getattr(both, name)[1, narrow.shape[1] :] == fill).all()
    assert both.banned_token_ids[1, 0] == 7 and (both.banned_token_ids[0] == -1).all()
