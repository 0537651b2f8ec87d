"""The ragged paged-attention reference against per-sequence dense causal numpy attention (the
kernels are tested against the reference: tests/kernels/test_ragged_paged_attention_gpu.py)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import ragged_paged_attention_reference


def make_batch(
    rng,
    q_lens,
    context_lens,
    *,
    num_heads,
    num_kv_heads,
    head_dim,
    page_size,
    dtype=jnp.float32,
    padding_rows=3,
    padding_seqs=1,
):
    """Random ragged batch: sequence s has q_lens[s] new tokens after context_lens[s] cached ones.

    Pages are distinct and shuffled (page 0 unused); ``padding_seqs`` unused slots follow the
    used sequences, with garbage cu_q_lens entries, and ``padding_rows`` rows follow the tokens.
    """
    num_seqs = len(q_lens)
    kv_lens = np.asarray(q_lens) + np.asarray(context_lens)
    width = max(1, int(-(-kv_lens.max() // page_size))) + 1
    max_seqs = num_seqs + padding_seqs
    num_pages = max_seqs * width + 1
    block_tables = (rng.permutation(num_pages - 1) + 1).reshape(max_seqs, width)
    cu_q_lens = np.concatenate([[0], np.cumsum(q_lens), np.zeros(padding_seqs, int)])
    num_tokens = int(np.sum(q_lens)) + padding_rows
    q = rng.standard_normal((num_tokens, num_heads, head_dim))
    k_pages = rng.standard_normal((num_kv_heads, num_pages, page_size, head_dim))
    v_pages = rng.standard_normal((num_kv_heads, num_pages, page_size, head_dim))
    kv_lens = np.concatenate([kv_lens, np.full(padding_seqs, 5)])
    return (
        jnp.asarray(q, dtype),
        jnp.asarray(k_pages, dtype),
        jnp.asarray(v_pages, dtype),
        jnp.asarray(kv_lens, jnp.int32),
        jnp.asarray(block_tables, jnp.int32),
        jnp.asarray(cu_q_lens, jnp.int32),
        jnp.asarray([num_seqs], jnp.int32),
    )


def naive_ragged(q, k_pages, v_pages, kv_lens, block_tables, cu_q_lens, num_seqs, **opts):
    """Dense float64 causal attention, one sequence at a time."""
    soft_cap, sliding_window = opts.get("soft_cap"), opts.get("sliding_window")
    q, k_pages, v_pages = (np.asarray(x, np.float64) for x in (q, k_pages, v_pages))
    _, num_heads, head_dim = q.shape
    num_kv_heads, _, page_size, _ = k_pages.shape
    group = num_heads // num_kv_heads
    out = np.zeros_like(q)
    for s in range(int(num_seqs[0])):
        start, end = int(cu_q_lens[s]), int(cu_q_lens[s + 1])
        kv_len = int(kv_lens[s])
        pages = np.asarray(block_tables[s])
        keys = k_pages[:, pages].reshape(num_kv_heads, -1, head_dim)[:, :kv_len]
        values = v_pages[:, pages].reshape(num_kv_heads, -1, head_dim)[:, :kv_len]
        for j, row in enumerate(range(start, end)):
            position = kv_len - (end - start) + j
            first = 0 if sliding_window is None else max(0, position - sliding_window + 1)
            for head in range(num_heads):
                k = keys[head // group, first : position + 1]
                v = values[head // group, first : position + 1]
                scores = k @ q[row, head] * head_dim**-0.5
                if soft_cap is not None:
                    scores = soft_cap * np.tanh(scores / soft_cap)
                probs = np.exp(scores - scores.max())
                out[row, head] = probs @ v / probs.sum()
    return out


# Chunks that start and end on either side of page boundaries, a decode-like row, an empty
# sequence and a prompt with no cached context.
Q_LENS = [5, 1, 0, 17, 8]
CONTEXT_LENS = [3, 20, 4, 0, 9]


@pytest.mark.parametrize(
    "soft_cap, sliding_window", [(None, None), (4.0, None), (None, 6), (3.0, 10)]
)
def test_reference_matches_dense_numpy(soft_cap, sliding_window):
    rng = np.random.default_rng(0)
    shapes = dict(num_heads=4, num_kv_heads=2, head_dim=32, page_size=8)
    args = make_batch(rng, Q_LENS, CONTEXT_LENS, **shapes)
    opts = dict(soft_cap=soft_cap, sliding_window=sliding_window)
    expected = naive_ragged(*args, **opts)
    actual = ragged_paged_attention_reference(*args, **opts)
    np.testing.assert_allclose(np.asarray(actual), expected, rtol=1e-5, atol=1e-5)
