"""Paged decode attention: the reference against dense numpy, the Pallas kernel (interpret mode)
against the reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.paged_attention import paged_attention, paged_attention_reference

# Compiled Triton kernels on a GPU, the Pallas interpreter everywhere else.
INTERPRET = jax.default_backend() != "gpu"
TOLERANCE = {jnp.float32: dict(rtol=1e-5, atol=2e-5), jnp.bfloat16: dict(rtol=2e-2, atol=2e-2)}


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


@pytest.mark.parametrize(
    "group, head_dim, page_size, dtype, soft_cap, sliding_window",
    [
        (1, 64, 8, jnp.float32, None, None),
        pytest.param(2, 128, 16, jnp.float32, 30.0, None, marks=pytest.mark.slow),
        pytest.param(4, 64, 32, jnp.float32, None, 13, marks=pytest.mark.slow),
        (8, 128, 8, jnp.float32, 2.0, 7),
        pytest.param(1, 128, 32, jnp.bfloat16, None, None, marks=pytest.mark.slow),
        (4, 128, 16, jnp.bfloat16, 5.0, 20),
        pytest.param(8, 64, 16, jnp.bfloat16, None, 1, marks=pytest.mark.slow),
    ],
)
def test_kernel_matches_reference(group, head_dim, page_size, dtype, soft_cap, sliding_window):
    rng = np.random.default_rng(group * 1000 + head_dim + page_size)
    num_kv_heads = 2
    args = make_batch(
        rng,
        boundary_lengths(page_size),
        num_heads=group * num_kv_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        page_size=page_size,
        dtype=dtype,
    )
    opts = dict(soft_cap=soft_cap, sliding_window=sliding_window)
    actual = paged_attention(*args, interpret=INTERPRET, **opts)
    expected = paged_attention_reference(*args, **opts)
    assert actual.dtype == dtype and actual.shape == args[0].shape
    np.testing.assert_allclose(
        np.asarray(actual, np.float32), np.asarray(expected, np.float32), **TOLERANCE[dtype]
    )
    assert not np.any(np.asarray(actual[4], np.float32)), "length-0 row must be zeros"


@pytest.mark.parametrize(
    "soft_cap, sliding_window, num_splits, pages_per_compute_block",
    [
        (None, 13, 3, 1),
        (2.0, None, 2, 2),
    ],
)
def test_kernel_options(soft_cap, sliding_window, num_splits, pages_per_compute_block):
    rng = np.random.default_rng(7)
    shapes = dict(num_heads=4, num_kv_heads=2, head_dim=64, page_size=8)
    args = make_batch(rng, boundary_lengths(8), **shapes)
    opts = dict(soft_cap=soft_cap, sliding_window=sliding_window)
    actual = paged_attention(
        *args,
        interpret=INTERPRET,
        num_splits=num_splits,
        pages_per_compute_block=pages_per_compute_block,
        **opts,
    )
    np.testing.assert_allclose(
        np.asarray(actual),
        np.asarray(paged_attention_reference(*args, **opts)),
        rtol=1e-5,
        atol=2e-5,
    )
    assert not np.isnan(np.asarray(actual)).any()


def test_inside_outer_jit_with_custom_scale():
    rng = np.random.default_rng(3)
    shapes = dict(num_heads=4, num_kv_heads=1, head_dim=64, page_size=16)
    args = make_batch(rng, [0, 0, 17], **shapes)

    @jax.jit
    def step(q, k_pages, v_pages, lengths, block_tables):
        out = paged_attention(
            q, k_pages, v_pages, lengths, block_tables, interpret=INTERPRET, scale=0.2
        )
        return out * 2.0

    actual = step(*args)
    expected = 2.0 * paged_attention_reference(*args, scale=0.2)
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=1e-5, atol=2e-5)
    assert not np.any(np.asarray(actual[:2])), "length-0 rows must be zeros, not NaN"


def _bad_inputs():
    q = jnp.zeros((2, 4, 64), jnp.float32)
    pages = jnp.zeros((2, 5, 8, 64), jnp.float32)
    lengths = jnp.zeros((2,), jnp.int32)
    tables = jnp.zeros((2, 3), jnp.int32)
    good = dict(q=q, k_pages=pages, v_pages=pages, lengths=lengths, block_tables=tables)
    return [
        ("q", dict(good, q=q[0])),
        ("q", dict(good, q=jnp.zeros((2, 3, 64)))),
        ("q", dict(good, q=q.astype(jnp.int32))),
        ("head_dim", dict(good, q=jnp.zeros((2, 4, 32)))),
        ("k_pages", dict(good, k_pages=pages[0])),
        ("v_pages", dict(good, v_pages=pages[:, :4])),
        ("v_pages", dict(good, v_pages=pages.astype(jnp.bfloat16))),
        ("lengths", dict(good, lengths=lengths.astype(jnp.float32))),
        ("lengths", dict(good, lengths=jnp.zeros((3,), jnp.int32))),
        ("block_tables", dict(good, block_tables=jnp.zeros((3, 3), jnp.int32))),
        ("block_tables", dict(good, block_tables=tables.astype(jnp.int16))),
    ]


@pytest.mark.parametrize("name, inputs", _bad_inputs())
def test_wrapper_rejects_bad_inputs(name, inputs):
    with pytest.raises(ValueError, match=name):
        paged_attention(**inputs, interpret=INTERPRET)


@pytest.mark.parametrize(
    "option", [dict(sliding_window=0), dict(soft_cap=-1.0), dict(pages_per_compute_block=0)]
)
def test_wrapper_rejects_bad_options(option):
    q = jnp.zeros((1, 2, 64), jnp.float32)
    pages = jnp.zeros((1, 2, 8, 64), jnp.float32)
    lengths, tables = jnp.ones((1,), jnp.int32), jnp.zeros((1, 2), jnp.int32)
    with pytest.raises(ValueError, match=next(iter(option))):
        paged_attention(q, pages, pages, lengths, tables, interpret=INTERPRET, **option)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_kernel_long_contexts(dtype):
    rng = np.random.default_rng(11)
    lengths = rng.integers(0, 600, size=8)
    args = make_batch(
        rng, lengths, num_heads=32, num_kv_heads=8, head_dim=128, page_size=16, dtype=dtype
    )
    for num_splits in (1, 4):
        actual = paged_attention(*args, interpret=INTERPRET, num_splits=num_splits)
        np.testing.assert_allclose(
            np.asarray(actual, np.float32),
            np.asarray(paged_attention_reference(*args), np.float32),
            **TOLERANCE[dtype],
        )
