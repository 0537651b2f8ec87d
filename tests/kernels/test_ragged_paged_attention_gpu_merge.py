"""The GPU decode kernel's split merge (``merge_splits``) against the textbook log-sum-exp merge
in float64: empty splits, maxima far apart, rows that saw no key."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from pallas_kernels.gpu.ragged_paged_attention.wrapper import merge_splits
from pallas_kernels.ragged_layout import MASK_VALUE


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
