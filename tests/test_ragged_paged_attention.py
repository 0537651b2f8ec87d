"""Ragged paged attention: the reference against per-sequence dense causal numpy attention, the
Pallas kernel (interpret mode) against the reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.ragged_paged_attention import (
    ragged_paged_attention,
    ragged_paged_attention_reference,
)

# Compiled Triton kernels on a GPU, the Pallas interpreter everywhere else.
INTERPRET = jax.default_backend() != "gpu"
TOLERANCE = {jnp.float32: dict(rtol=1e-5, atol=2e-5), jnp.bfloat16: dict(rtol=2e-2, atol=2e-2)}


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


@pytest.mark.parametrize(
    "group, head_dim, page_size, dtype, soft_cap, sliding_window",
    [
        (1, 64, 8, jnp.float32, None, None),
        pytest.param(2, 128, 16, jnp.float32, 30.0, None, marks=pytest.mark.slow),
        pytest.param(4, 64, 32, jnp.float32, None, 6, marks=pytest.mark.slow),
        (8, 128, 8, jnp.float32, 2.0, 13),
        pytest.param(1, 128, 16, jnp.bfloat16, None, None, marks=pytest.mark.slow),
        (4, 64, 8, jnp.bfloat16, 3.0, 1),
        pytest.param(8, 128, 32, jnp.bfloat16, None, 10, marks=pytest.mark.slow),
    ],
)
def test_kernel_matches_reference(group, head_dim, page_size, dtype, soft_cap, sliding_window):
    rng = np.random.default_rng(group * 1000 + head_dim + page_size)
    num_kv_heads = 2
    args = make_batch(
        rng,
        Q_LENS,
        CONTEXT_LENS,
        num_heads=group * num_kv_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        page_size=page_size,
        dtype=dtype,
    )
    opts = dict(soft_cap=soft_cap, sliding_window=sliding_window)
    actual = ragged_paged_attention(*args, interpret=INTERPRET, **opts)
    expected = ragged_paged_attention_reference(*args, **opts)
    assert actual.dtype == dtype and actual.shape == args[0].shape
    np.testing.assert_allclose(
        np.asarray(actual, np.float32), np.asarray(expected, np.float32), **TOLERANCE[dtype]
    )
    assert not np.any(np.asarray(actual[sum(Q_LENS) :], np.float32)), "padding rows must be zero"


@pytest.mark.parametrize(
    "soft_cap, sliding_window, block_q, pages_per_compute_block",
    [
        (30.0, None, 4, 1),
        (None, 6, 2, 2),
    ],
)
def test_kernel_options(soft_cap, sliding_window, block_q, pages_per_compute_block):
    rng = np.random.default_rng(5)
    shapes = dict(num_heads=4, num_kv_heads=2, head_dim=64, page_size=8)
    args = make_batch(rng, Q_LENS, CONTEXT_LENS, **shapes)
    opts = dict(soft_cap=soft_cap, sliding_window=sliding_window)
    actual = ragged_paged_attention(
        *args,
        interpret=INTERPRET,
        block_q=block_q,
        pages_per_compute_block=pages_per_compute_block,
        **opts,
    )
    expected = ragged_paged_attention_reference(*args, **opts)
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=1e-5, atol=2e-5)


def test_fewer_sequences_in_use_and_outer_jit():
    """num_seqs smaller than the slots: rows of the unused sequences are padding and stay zero."""
    rng = np.random.default_rng(9)
    shapes = dict(num_heads=4, num_kv_heads=1, head_dim=64, page_size=16)
    q, k_pages, v_pages, kv_lens, tables, cu_q_lens, _ = make_batch(
        rng, [3, 9, 4], [2, 30, 0], padding_rows=0, **shapes
    )
    num_seqs = jnp.asarray([2], jnp.int32)

    @jax.jit
    def step(q, k_pages, v_pages, kv_lens, tables, cu_q_lens, num_seqs):
        out = ragged_paged_attention(
            q,
            k_pages,
            v_pages,
            kv_lens,
            tables,
            cu_q_lens,
            num_seqs,
            interpret=INTERPRET,
            scale=0.1,
        )
        return out + 1.0

    args = (q, k_pages, v_pages, kv_lens, tables, cu_q_lens, num_seqs)
    actual = np.asarray(step(*args)) - 1.0
    expected = np.asarray(ragged_paged_attention_reference(*args, scale=0.1))
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=2e-5)
    assert not np.any(actual[12:]), "rows of sequences past num_seqs must be zero"
    assert np.any(actual[:12])


def _bad_inputs():
    q = jnp.zeros((6, 4, 64), jnp.float32)
    pages = jnp.zeros((2, 5, 8, 64), jnp.float32)
    kv_lens = jnp.zeros((2,), jnp.int32)
    tables = jnp.zeros((2, 3), jnp.int32)
    cu_q_lens = jnp.asarray([0, 3, 6], jnp.int32)
    num_seqs = jnp.asarray([2], jnp.int32)
    good = dict(
        q=q,
        k_pages=pages,
        v_pages=pages,
        kv_lens=kv_lens,
        block_tables=tables,
        cu_q_lens=cu_q_lens,
        num_seqs=num_seqs,
    )
    return [
        ("q", dict(good, q=q[0])),
        ("q", dict(good, q=jnp.zeros((6, 3, 64)))),
        ("head_dim", dict(good, q=jnp.zeros((6, 4, 128)))),
        ("k_pages", dict(good, k_pages=pages[0])),
        ("v_pages", dict(good, v_pages=pages[:1])),
        ("kv_lens", dict(good, kv_lens=jnp.zeros((3,), jnp.int32))),
        ("kv_lens", dict(good, kv_lens=kv_lens.astype(jnp.float32))),
        ("block_tables", dict(good, block_tables=tables[0])),
        ("block_tables", dict(good, block_tables=tables.astype(jnp.uint32))),
        ("cu_q_lens", dict(good, cu_q_lens=cu_q_lens[:2])),
        ("num_seqs", dict(good, num_seqs=jnp.asarray(2, jnp.int32))),
        ("block_q", dict(good, block_q=0)),
    ]


@pytest.mark.parametrize("name, inputs", _bad_inputs())
def test_wrapper_rejects_bad_inputs(name, inputs):
    with pytest.raises(ValueError, match=name):
        ragged_paged_attention(**inputs, interpret=INTERPRET)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_kernel_long_prompts(dtype):
    rng = np.random.default_rng(13)
    q_lens = [130, 1, 64, 37]
    context_lens = [0, 300, 129, 17]
    args = make_batch(
        rng,
        q_lens,
        context_lens,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        page_size=16,
        dtype=dtype,
    )
    for sliding_window in (None, 100):
        actual = ragged_paged_attention(*args, interpret=INTERPRET, sliding_window=sliding_window)
        expected = ragged_paged_attention_reference(*args, sliding_window=sliding_window)
        np.testing.assert_allclose(
            np.asarray(actual, np.float32), np.asarray(expected, np.float32), **TOLERANCE[dtype]
        )


@pytest.mark.parametrize(
    "kv_cache_dtype, head_dim, page_size, soft_cap, sliding_window",
    [
        pytest.param("int8", 64, 8, None, None, marks=pytest.mark.slow),
        ("fp8", 128, 4, 5.0, None),
        ("int8", 40, 8, None, 9),
    ],
)
def test_kernel_on_8bit_pool_matches_reference_on_dequantised_pages(
    kv_cache_dtype, head_dim, page_size, soft_cap, sliding_window
):
    """The kernel reads an 8-bit pool (codes + per-token group scales) and dequantises each key
    block itself; the reference attends over the same pool dequantised."""
    from tests.test_paged_attention_cpu import quantized_pool

    rng = np.random.default_rng(head_dim)
    q, k_pages, v_pages, *metadata = make_batch(
        rng,
        [1, 1, 1, 7, 12],
        [0, page_size - 1, page_size, page_size + 3, 2 * page_size - 2],  # straddling pages
        num_heads=8,
        num_kv_heads=2,
        head_dim=head_dim,
        page_size=page_size,
    )
    k_pool, v_pool = (
        quantized_pool(k_pages, kv_cache_dtype),
        quantized_pool(v_pages, kv_cache_dtype),
    )
    every_page = jnp.arange(k_pages.shape[1], dtype=jnp.int32)
    opts = dict(soft_cap=soft_cap, sliding_window=sliding_window)
    out = ragged_paged_attention(q, k_pool, v_pool, *metadata, interpret=INTERPRET, **opts)
    expected = ragged_paged_attention_reference(
        q, k_pool.gather(every_page), v_pool.gather(every_page), *metadata, **opts
    )
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), **TOLERANCE[jnp.float32])


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8"])
def test_kernel_on_8bit_pool_lowers_for_cuda(kv_cache_dtype):
    """Lowered only (no GPU here): Pallas emits the Triton kernel for the 8-bit pool, which
    reaches it as codes and scales (no dequantised pool in the module)."""
    from jaxgen.quantization import kv_cache

    pool = kv_cache.pool_shapes(kv_cache_dtype, (8, 4096, 16, 128), jnp.bfloat16)
    i32 = jnp.int32
    shapes = (
        jax.ShapeDtypeStruct((64, 32, 128), jnp.bfloat16),
        pool,
        pool,
        jax.ShapeDtypeStruct((64,), i32),
        jax.ShapeDtypeStruct((64, 128), i32),
        jax.ShapeDtypeStruct((65,), i32),
        jax.ShapeDtypeStruct((1,), i32),
    )
    lowered = jax.jit(ragged_paged_attention).trace(*shapes).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    assert text.count("__gpu$xla.gpu.triton") == 1
    assert "tensor<8x4096x16x128xbf16>" not in text and "tensor<8x4096x16x128xf32>" not in text
