"""The TPU kernels on an 8-bit pool (int8 / fp8 codes + per-token, per-head scales): the update
kernel against its scatter reference, attention against the pure-jnp reference on the same pool
dequantised (interpret mode on CPU: shuffled page tables, page-boundary lengths, prefill chunks),
and AOT Mosaic compiles for a v5e chip."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.tpu import ragged_paged_attention_reference_tpu, ragged_paged_attention_tpu
from pallas_kernels.tpu.kv_cache_update import (
    update_quantized_pool_reference,
    update_quantized_pool_tpu,
)
from pallas_kernels.tpu.kv_pool import QuantizedKVPool, quantized_pool_shapes, zeros_quantized_pool
from tests.kernels.test_ragged_paged_attention_tpu import (
    _compile,
    assert_no_races,
    make_batch,
    mixed_seqs,
    needs_libtpu,
    v5e_mesh,  # noqa: F401 (fixture)
)

INTERPRET = pltpu.InterpretParams(detect_races=True)


def filled_pool(rng, kind, num_pages, page_size, num_kv_heads, head_dim, dtype):
    """A pool whose every slot was written in shuffled order by the scatter reference; the update
    kernel rewrites a shuffled subset (several tokens per page, pages out of order) and must
    match the reference bit for bit (all slots through the interpreter would take minutes)."""
    shapes = quantized_pool_shapes(kind, num_pages, page_size, num_kv_heads, head_dim)
    slots = num_pages * page_size
    k = jnp.asarray(rng.normal(size=(slots, num_kv_heads, head_dim)) * 2.0, dtype)
    v = jnp.asarray(rng.normal(size=(slots, num_kv_heads, head_dim)), dtype)
    order = jnp.asarray(rng.permutation(slots), jnp.int32)
    pool = update_quantized_pool_reference(zeros_quantized_pool(shapes), k, v, order)
    subset = order[:96]
    k2, v2 = k[:96] * 0.5, v[:96] * 0.5
    written = update_quantized_pool_tpu(pool, k2, v2, subset, interpret=INTERPRET)
    assert_no_races()
    expected = update_quantized_pool_reference(pool, k2, v2, subset)
    np.testing.assert_array_equal(
        np.asarray(written.codes.astype(jnp.float32)),
        np.asarray(expected.codes.astype(jnp.float32)),
    )
    np.testing.assert_array_equal(np.asarray(written.scales), np.asarray(expected.scales))
    return written


CASES = [
    # (kind, dtype, Hq, Hkv, D, page_size, soft_cap, sliding_window)
    pytest.param(
        "int8",
        jnp.float32,
        8,
        2,
        64,
        128,
        None,
        None,
        id="int8-f32-gqa4-d64",
        marks=pytest.mark.slow,
    ),
    pytest.param(
        "fp8",
        jnp.float32,
        4,
        1,
        128,
        128,
        5.0,
        None,
        id="fp8-f32-mqa-d128-softcap",
        marks=pytest.mark.slow,
    ),
    pytest.param(
        "int8",
        jnp.bfloat16,
        4,
        1,
        128,
        128,
        None,
        40,
        id="int8-bf16-mqa-d128-window",
        marks=pytest.mark.slow,
    ),
    pytest.param(
        "int8",
        jnp.bfloat16,
        4,
        2,
        256,
        128,
        None,
        None,
        id="int8-bf16-gqa2-d256-two-scale-groups",
        marks=pytest.mark.slow,
    ),
]


@pytest.mark.parametrize("kind,dtype,num_q_heads,num_kv_heads,head_dim,page_size,cap,window", CASES)
def test_attention_on_8bit_pool_matches_reference(
    kind, dtype, num_q_heads, num_kv_heads, head_dim, page_size, cap, window
):
    rng = np.random.default_rng(3)
    seqs = mixed_seqs(page_size, 2 * page_size + 3)  # 1, S-1, S, S+1 keys; prefill chunks
    q, float_pool, kv_lens, tables, cu_q_lens, num_seqs = make_batch(
        rng,
        page_size=page_size,
        seqs=seqs,
        max_seqs=len(seqs) + 1,
        pages_per_seq=3,
        num_tokens=sum(n for n, _ in seqs) + 5,
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
    )
    pool = filled_pool(rng, kind, float_pool.shape[0], page_size, num_kv_heads, head_dim, dtype)
    opts = dict(scale=head_dim**-0.5, soft_cap=cap, sliding_window=window)
    metadata = (kv_lens, tables, cu_q_lens, num_seqs)
    out = ragged_paged_attention_tpu(
        q,
        pool,
        *metadata,
        **opts,
        num_kv_heads=num_kv_heads,
        num_kv_pages_per_block=2,
        num_queries_per_block=8,
        interpret=INTERPRET,
    )
    assert_no_races()
    dequantized = pool.dequantize(head_dim).astype(dtype)
    expected = ragged_paged_attention_reference_tpu(
        q, dequantized, *metadata, **opts, num_kv_heads=num_kv_heads
    )
    out, expected = np.asarray(out, np.float32), np.asarray(expected, np.float32)
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(out, expected, rtol=tol, atol=tol)
    np.testing.assert_array_equal(out[int(cu_q_lens[len(seqs)]) :], 0.0)


def test_8bit_pool_rejects_bad_inputs():
    shapes = quantized_pool_shapes("int8", 9, 128, 2, 64)
    pool = zeros_quantized_pool(shapes)
    q = jnp.zeros((8, 4, 64), jnp.float32)
    i32 = jnp.int32
    metadata = (jnp.zeros(2, i32), jnp.ones((2, 4), i32), jnp.zeros(3, i32), jnp.ones(1, i32))
    bad_scales = QuantizedKVPool(pool.codes, pool.scales[:, :2])  # [P, C * G, S] needs 4 rows
    with pytest.raises(ValueError, match="kv_pages scales"):
        ragged_paged_attention_tpu(q, bad_scales, *metadata, scale=0.1)
    small_pages = QuantizedKVPool(pool.codes[:, :32], pool.scales[..., :32])
    with pytest.raises(ValueError, match="page_size 32 must be a multiple of 128"):
        ragged_paged_attention_tpu(q, small_pages, *metadata, scale=0.1)
    with pytest.raises(ValueError, match="page_size=64: an 8-bit TPU pool"):
        quantized_pool_shapes("int8", 9, 64, 2, 64)
    with pytest.raises(ValueError, match="kv_cache_dtype must be 'int8' or 'fp8'"):
        quantized_pool_shapes("int4", 9, 128, 2, 64)
    with pytest.raises(ValueError, match="slot_mapping"):
        update_quantized_pool_tpu(pool, q[:, :2], q[:, :2], jnp.zeros(8, jnp.float32))
    with pytest.raises(ValueError, match="pool.scales"):
        update_quantized_pool_tpu(bad_scales, q[:, :2], q[:, :2], jnp.zeros(8, i32))


def test_update_writes_each_page_once_per_run_of_tokens():
    """Engine-like slots (each sequence's tokens consecutive, pages shuffled) and a page written
    in two separate runs: codes and scales equal the scatter reference."""
    rng = np.random.default_rng(5)
    shapes = quantized_pool_shapes("int8", 6, 128, 1, 128)
    pool = zeros_quantized_pool(shapes)
    slots = np.concatenate([3 * 128 + np.arange(100), 5 * 128 + np.arange(40), [-1, 6 * 128]])
    slots = np.concatenate([slots, 3 * 128 + 100 + np.arange(5)])  # page 3 again, later
    slots = jnp.asarray(slots, jnp.int32)
    k = jnp.asarray(rng.normal(size=(len(slots), 1, 128)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(len(slots), 1, 128)) * 3.0, jnp.float32)
    out = update_quantized_pool_tpu(pool, k, v, slots, interpret=INTERPRET)
    assert_no_races()
    expected = update_quantized_pool_reference(pool, k, v, slots)
    np.testing.assert_array_equal(np.asarray(out.codes), np.asarray(expected.codes))
    np.testing.assert_array_equal(np.asarray(out.scales), np.asarray(expected.scales))


# Llama-3-8B, bf16 queries, page 128: per v5e-4 chip 8 query heads and 2 KV heads (where a
# padded token-major scale layout cost as much as the codes), per v5e-1 chip 32 and 8.
CHIPS = {
    "v5e-4": dict(num_q_heads=8, num_kv_heads=2),
    "v5e-1": dict(num_q_heads=32, num_kv_heads=8),
}
HEAD_DIM, PAGE_SIZE = 128, 128


def _pool_shapes(kind, pool_bytes, num_kv_heads):
    page = quantized_pool_shapes(kind, 1, PAGE_SIZE, num_kv_heads, HEAD_DIM)
    page_bytes = page.codes.size + page.scales.size * page.scales.dtype.itemsize
    pages = pool_bytes // page_bytes
    return quantized_pool_shapes(kind, pages, PAGE_SIZE, num_kv_heads, HEAD_DIM)


@needs_libtpu
@pytest.mark.tpu_compile
@pytest.mark.parametrize(
    "chip,kind,num_tokens,max_seqs,pages_per_seq",
    [
        pytest.param("v5e-4", "int8", 64, 64, 16, id="v5e-4-int8-decode-64x2048"),
        pytest.param("v5e-1", "int8", 64, 64, 16, id="v5e-1-int8-decode-64x2048"),
        pytest.param(
            "v5e-1", "fp8", 64, 64, 16, id="v5e-1-fp8-decode-64x2048", marks=pytest.mark.slow
        ),
        pytest.param("v5e-1", "int8", 512, 8, 16, id="v5e-1-int8-prefill", marks=pytest.mark.slow),
    ],
)
def test_attention_on_8bit_pool_aot_compile_v5e(
    v5e_mesh,  # noqa: F811
    chip,
    kind,
    num_tokens,
    max_seqs,
    pages_per_seq,
):
    heads = CHIPS[chip]
    pool = _pool_shapes(kind, 8 * 2**30, heads["num_kv_heads"])
    i32 = jnp.int32
    shapes = [
        jax.ShapeDtypeStruct((num_tokens, heads["num_q_heads"], HEAD_DIM), jnp.bfloat16),
        pool,
        jax.ShapeDtypeStruct((max_seqs,), i32),
        jax.ShapeDtypeStruct((max_seqs, pages_per_seq), i32),
        jax.ShapeDtypeStruct((max_seqs + 1,), i32),
        jax.ShapeDtypeStruct((1,), i32),
    ]
    fn = functools.partial(
        ragged_paged_attention_tpu, scale=HEAD_DIM**-0.5, num_kv_heads=heads["num_kv_heads"]
    )
    compiled, seconds = _compile(v5e_mesh, fn, *shapes)
    measured = compiled.cost_analysis()["bytes accessed"]
    page_codes = int(np.prod(pool.codes.shape[1:]))
    page_scales = int(np.prod(pool.scales.shape[1:])) * pool.scales.dtype.itemsize
    pages_read = min(max_seqs, num_tokens) * pages_per_seq
    kv_floor = pages_read * (page_codes + page_scales)
    bf16_kv = pages_read * page_codes * 2
    q_bytes = 2 * num_tokens * heads["num_q_heads"] * HEAD_DIM * 2
    temp = compiled.memory_analysis().temp_size_in_bytes
    print(
        f"\nrpa {kind} {chip} T={num_tokens} seqs={max_seqs} pages/seq={pages_per_seq} "
        f"codes={pool.codes.shape} scales={pool.scales.shape}: compile {seconds:.1f}s, bytes "
        f"accessed {measured:.4g} (8-bit KV {kv_floor:.4g}, bf16 KV would be {bf16_kv:.4g}), "
        f"temp {temp} B"
    )
    assert page_scales * HEAD_DIM // 2 == page_codes  # one bfloat16 per head's codes, no padding
    assert measured <= 1.05 * kv_floor + q_bytes
    assert measured <= 0.6 * bf16_kv + q_bytes
    assert temp < 64 * 2**20  # the pool is never copied or dequantised whole


@needs_libtpu
@pytest.mark.tpu_compile
def test_update_8bit_pool_aot_compile_v5e(v5e_mesh):  # noqa: F811
    heads = CHIPS["v5e-4"]
    pool = _pool_shapes("int8", 8 * 2**30, heads["num_kv_heads"])
    num_tokens = 64
    new = jax.ShapeDtypeStruct((num_tokens, heads["num_kv_heads"], HEAD_DIM), jnp.bfloat16)
    shapes = [pool, new, new, jax.ShapeDtypeStruct((num_tokens,), jnp.int32)]
    compiled, seconds = _compile(v5e_mesh, update_quantized_pool_tpu, *shapes, donate_argnums=0)
    measured = compiled.cost_analysis()["bytes accessed"]
    row_bytes = int(np.prod(pool.codes.shape[2:]))
    tile_bytes = int(np.prod(pool.scales.shape[1:])) * pool.scales.dtype.itemsize
    print(
        f"\nkv update int8 v5e-4 chip T={num_tokens}: compile {seconds:.1f}s, bytes accessed "
        f"{measured:.4g} (code rows {num_tokens * row_bytes}, scale tiles read and written "
        f"{2 * num_tokens * tile_bytes})"
    )
    # The rows, one scale tile per token read and written, and XLA's quantising of the rows,
    # never the 8 GB pool.
    assert measured < 32 * 2**20
    assert compiled.memory_analysis().temp_size_in_bytes < 2**20
