"""The paged decode-attention reference (the native CPU kernel's contract) against dense numpy
attention, and the batch helpers the CPU kernel's tests share."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import paged_attention_reference


def make_batch(
    rng, lengths, *, num_heads, num_kv_heads, head_dim, page_size, dtype=jnp.float32, spare_pages=1
):
    """Random q and page pool; every sequence gets distinct pages in shuffled order (page 0 unused)."""
    lengths = np.asarray(lengths, np.int32)
    width = max(1, int(-(-lengths.max() // page_size))) + spare_pages
    num_pages = len(lengths) * width + 1
    block_tables = (rng.permutation(num_pages - 1)[: len(lengths) * width] + 1).reshape(-1, width)
    q = rng.standard_normal((len(lengths), num_heads, head_dim))
    k_pages = rng.standard_normal((num_kv_heads, num_pages, page_size, head_dim))
    v_pages = rng.standard_normal((num_kv_heads, num_pages, page_size, head_dim))
    return (
        jnp.asarray(q, dtype),
        jnp.asarray(k_pages, dtype),
        jnp.asarray(v_pages, dtype),
        jnp.asarray(lengths, jnp.int32),
        jnp.asarray(block_tables, jnp.int32),
    )


def naive_decode(q, k_pages, v_pages, lengths, block_tables, *, soft_cap=None, sliding_window=None):
    """Dense float64 attention of each sequence's query over its gathered keys."""
    q, k_pages, v_pages = (np.asarray(x, np.float64) for x in (q, k_pages, v_pages))
    batch, num_heads, head_dim = q.shape
    num_kv_heads, _, page_size, _ = k_pages.shape
    group = num_heads // num_kv_heads
    out = np.zeros_like(q)
    for b, length in enumerate(np.asarray(lengths)):
        pages = np.asarray(block_tables[b])
        keys = k_pages[:, pages].reshape(num_kv_heads, -1, head_dim)[:, :length]
        values = v_pages[:, pages].reshape(num_kv_heads, -1, head_dim)[:, :length]
        start = 0 if sliding_window is None else max(0, length - sliding_window)
        for head in range(num_heads):
            k, v = keys[head // group, start:], values[head // group, start:]
            if len(k) == 0:
                continue
            scores = k @ q[b, head] * head_dim**-0.5
            if soft_cap is not None:
                scores = soft_cap * np.tanh(scores / soft_cap)
            probs = np.exp(scores - scores.max())
            out[b, head] = probs @ v / probs.sum()
    return out


def boundary_lengths(page_size):
    """Lengths that straddle page boundaries, plus an empty row and a long one."""
    return [1, page_size - 1, page_size, page_size + 1, 0, 5 * page_size + 3]


@pytest.mark.parametrize(
    "soft_cap, sliding_window", [(None, None), (5.0, None), (None, 11), (3.0, 20)]
)
def test_reference_matches_dense_numpy(soft_cap, sliding_window):
    rng = np.random.default_rng(0)
    shapes = dict(num_heads=8, num_kv_heads=2, head_dim=32, page_size=8)
    args = make_batch(rng, boundary_lengths(8), **shapes)
    opts = dict(soft_cap=soft_cap, sliding_window=sliding_window)
    expected = naive_decode(*args, **opts)
    actual = paged_attention_reference(*args, **opts)
    np.testing.assert_allclose(np.asarray(actual), expected, rtol=1e-5, atol=1e-5)
