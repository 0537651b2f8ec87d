"""The GPU decode kernel's split merges: XLA's (``merge_splits``) against the textbook log-sum-exp
merge in float64 (empty splits, maxima far apart, rows that saw no key), the one-kernel Pallas
merge (``merge.py``, interpreted off the GPU) against XLA's and inside the whole call."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.gpu.ragged_paged_attention.merge import merge_lane_chunk, merge_splits_kernel
from pallas_kernels.gpu.ragged_paged_attention.wrapper import merge_splits
from pallas_kernels.ragged_layout import MASK_VALUE
from tests.kernels.test_ragged_paged_attention_gpu import (
    TOLERANCE,
    attend,
    check,
    decode_only_batch,
    mixed_batch,
    reference,
)


def textbook_merge(acc, row_max, row_sum):
    """The max over splits first, then the weighted sums (float64)."""
    acc, row_max, row_sum = (np.asarray(x, np.float64) for x in (acc, row_max, row_sum))
    top = row_max.max(axis=0)
    weight = np.where(row_max > MASK_VALUE, np.exp(row_max - top), 0.0)
    total = (row_sum * weight).sum(axis=0)
    out = (acc * weight[..., None]).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total[..., None] > 0, out / total[..., None], 0.0)


def test_merge_matches_the_textbook_merge():
    rng = np.random.default_rng(0)
    splits, seqs, heads, rows, lanes = 7, 3, 2, 4, 16
    row_max = rng.normal(0, 30, (splits, seqs, heads, rows)).astype(np.float32)
    row_max[:, 0, 0, 0] += np.arange(splits) * 150.0  # maxima hundreds apart: exp(-x) underflows
    row_sum = rng.uniform(0.5, 3.0, row_max.shape).astype(np.float32)
    acc = (rng.normal(size=(*row_max.shape, lanes)) * row_sum[..., None]).astype(np.float32)
    # Empty splits (no key in their range): max MASK_VALUE, sum 0, acc 0.
    for split, seq in ((0, 1), (3, 1), (6, 2)):
        row_max[split, seq], row_sum[split, seq], acc[split, seq] = MASK_VALUE, 0.0, 0.0
    # A sequence that saw no key at all: every split empty.
    row_max[:, 2, 1], row_sum[:, 2, 1], acc[:, 2, 1] = MASK_VALUE, 0.0, 0.0
    merged = np.asarray(merge_splits(jnp.asarray(acc), jnp.asarray(row_max), jnp.asarray(row_sum)))
    expected = textbook_merge(acc, row_max, row_sum)
    assert merged.shape == (seqs, heads, rows, lanes)
    assert np.all(np.isfinite(merged))
    np.testing.assert_allclose(merged, expected, rtol=1e-5, atol=1e-6)
    assert not merged[2, 1].any()  # no key: zeros, never NaN


def test_one_split_is_its_own_normalised_state():
    rng = np.random.default_rng(1)
    acc = rng.normal(size=(1, 2, 3, 8)).astype(np.float32)
    row_sum = rng.uniform(1.0, 2.0, (1, 2, 3)).astype(np.float32)
    row_max = rng.normal(size=(1, 2, 3)).astype(np.float32)
    merged = merge_splits(jnp.asarray(acc), jnp.asarray(row_max), jnp.asarray(row_sum))
    np.testing.assert_allclose(np.asarray(merged), acc[0] / row_sum[0][..., None], rtol=1e-6)


@pytest.mark.parametrize("decode_only", [True, False])
def test_pallas_merge_matches_the_xla_merge(decode_only):
    """The one-kernel merge (interpreted here) on 33 splits (padded to 64), a group of 3 (4 rows
    read of 16), head_dim 96 of 128 lanes in chunks: the XLA merge's rows, written straight into
    the step's bfloat16 output (a decode-only step: row s is slot s; a mixed step: the decode
    sequences' rows, every other row kept)."""
    rng = np.random.default_rng(2)
    splits, seqs, heads, rows, lanes, group, head_dim = 33, 3, 3, 16, 128, 3, 96
    row_max = rng.normal(0, 20, (splits, seqs, heads, rows)).astype(np.float32)
    row_sum = rng.uniform(0.5, 3.0, row_max.shape).astype(np.float32)
    acc = rng.normal(size=(*row_max.shape, lanes)).astype(np.float32)
    row_max[2:, 1, 2], row_sum[2:, 1, 2], acc[2:, 1, 2] = MASK_VALUE, 0.0, 0.0  # short row
    row_max[:, 0, 1], row_sum[:, 0, 1], acc[:, 0, 1] = MASK_VALUE, 0.0, 0.0  # no key at all
    args = [jnp.asarray(x) for x in (acc, row_max, row_sum)]
    assert merge_lane_chunk(splits, 4, lanes) < head_dim  # several lane chunks a (slot, head)
    expected = merge_splits(
        args[0][..., :group, :head_dim], args[1][..., :group], args[2][..., :group]
    ).reshape(seqs, heads * group, head_dim)
    if decode_only:
        cu_q_lens = jnp.arange(seqs + 1, dtype=jnp.int32)
        out = jax.ShapeDtypeStruct((seqs, heads * group, head_dim), jnp.bfloat16)
        rows_of = {0: 0, 1: 1, 2: 2}
    else:  # slot 0: one query at row 4; slot 1: three queries (not the merge's); slot 2: row 0
        cu_q_lens = jnp.asarray([4, 5, 8, 9], jnp.int32)  # sanitised: slot 2 is row 8
        out = jnp.full((10, heads * group, head_dim), 7.0, jnp.bfloat16)
        rows_of = {0: 4, 2: 8}
    merged = merge_splits_kernel(
        *args, cu_q_lens, out, group=group, decode_only=decode_only, interpret=True
    )
    assert merged.shape == out.shape and merged.dtype == jnp.bfloat16
    merged = np.asarray(merged.astype(jnp.float32))
    for slot, row in rows_of.items():
        want = np.asarray(expected[slot].astype(jnp.bfloat16).astype(jnp.float32))
        np.testing.assert_array_equal(merged[row], want)
    assert not merged[rows_of[0], 3:6].any()  # slot 0's KV head 1 saw no key: zeros
    if not decode_only:  # every row the merge does not own is as it was
        untouched = [r for r in range(out.shape[0]) if r not in rows_of.values()]
        assert (merged[untouched] == 7.0).all()


@pytest.mark.parametrize("decode_only", [False, True])
def test_kernel_with_the_pallas_merge_matches_reference(decode_only):
    """The whole call with ``pallas_merge=True``: a mixed step (GQA 3, head_dim 96, three splits)
    and a decode-only one (GQA 4, the default splits, most of them empty)."""
    if decode_only:
        args = decode_only_batch(jnp.float32)
        actual = attend(*args, decode_only=True, pallas_merge=True)
        expected = reference(*args)
        np.testing.assert_allclose(
            np.asarray(actual), np.asarray(expected), **TOLERANCE[jnp.float32]
        )
        assert not np.asarray(actual[6:]).any()
        return
    args, reference_args = mixed_batch(3096, group=3, head_dim=96, dtype=jnp.float32)
    check(
        args,
        reference_args,
        dtype=jnp.float32,
        options=dict(soft_cap=3.0, sliding_window=11),
        tuning=dict(num_splits=3, decode_block_k=16, pallas_merge=True),
    )
