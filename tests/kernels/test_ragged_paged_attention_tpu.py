"""TPU ragged paged attention and KV update kernels vs their references (interpret mode on CPU,
with race detection), input validation, and AOT Mosaic compiles for a v5e target."""

from __future__ import annotations

import functools
import importlib.util
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels import ragged_paged_attention_reference
from pallas_kernels.tpu import (
    attention_cost,
    deinterleave_kv,
    interleave_kv,
    kv_pool_shape,
    padded_num_kv_heads,
    ragged_paged_attention_reference_tpu,
    ragged_paged_attention_tpu,
    update_kv_cache_reference,
    update_kv_cache_tpu,
)

INTERPRET = pltpu.InterpretParams(detect_races=True)


def assert_no_races():
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call

    races = interpret_pallas_call.races
    assert races is None or not races.races_found


def make_batch(
    rng,
    *,
    page_size,
    seqs,  # [(q_len, kv_len)], decode rows first
    max_seqs,
    pages_per_seq,
    num_tokens,
    num_q_heads,
    num_kv_heads,
    head_dim,
    dtype,
):
    """Random q, pool and metadata; page tables are a shuffled permutation of pages 1..P-1."""
    num_pages = max_seqs * pages_per_seq + 1
    pool = jnp.asarray(
        rng.normal(size=kv_pool_shape(num_pages, page_size, num_kv_heads, head_dim, dtype)), dtype
    )
    tables = rng.permutation(np.arange(1, num_pages)).reshape(max_seqs, pages_per_seq)
    kv_lens = rng.integers(0, 1000, max_seqs)  # garbage past num_seqs
    cu_q_lens = np.full(max_seqs + 1, 10_000)  # garbage past num_seqs
    cu_q_lens[0] = 0
    for s, (q_len, kv_len) in enumerate(seqs):
        kv_lens[s] = kv_len
        cu_q_lens[s + 1] = cu_q_lens[s] + q_len
    assert cu_q_lens[len(seqs)] <= num_tokens
    q = jnp.asarray(rng.normal(size=(num_tokens, num_q_heads, head_dim)), dtype)
    return (
        q,
        pool,
        jnp.asarray(kv_lens, jnp.int32),
        jnp.asarray(tables, jnp.int32),
        jnp.asarray(cu_q_lens, jnp.int32),
        jnp.asarray([len(seqs)], jnp.int32),
    )


def mixed_seqs(page_size, long_len):
    """Decode rows (kv 1, page-1, page, page+1, long), an empty sequence, prefill chunks (fresh,
    starting mid-sequence, and a long one)."""
    decode = [(1, 1), (1, page_size - 1), (1, page_size), (1, page_size + 1), (1, long_len)]
    return decode + [(0, 5), (7, 7), (12, page_size + 20), (9, long_len)]


CASES = [
    # (dtype, Hq, Hkv, D, page_size, soft_cap, sliding_window, pages/block, queries/block)
    pytest.param(
        jnp.float32, 2, 2, 128, 16, None, None, 2, 8, id="f32-mha-d128", marks=pytest.mark.slow
    ),
    pytest.param(jnp.float32, 8, 2, 64, 16, 5.0, None, 2, 8, id="f32-gqa4-d64-softcap"),
    pytest.param(jnp.bfloat16, 8, 1, 128, 32, None, 20, 2, 8, id="bf16-mqa8-d128-window"),
    pytest.param(jnp.bfloat16, 4, 1, 64, 16, None, None, None, None, id="bf16-gqa4-d64-defaults"),
]


@pytest.mark.parametrize(
    "dtype,num_q_heads,num_kv_heads,head_dim,page_size,soft_cap,window,pages,queries", CASES
)
def test_attention_matches_reference(
    dtype, num_q_heads, num_kv_heads, head_dim, page_size, soft_cap, window, pages, queries
):
    rng = np.random.default_rng(0)
    long_len = 4 * page_size + 3  # several KV blocks of 2 pages
    seqs = mixed_seqs(page_size, long_len)
    args = make_batch(
        rng,
        page_size=page_size,
        seqs=seqs,
        max_seqs=len(seqs) + 2,
        pages_per_seq=5,
        num_tokens=sum(q for q, _ in seqs) + 5,  # padding rows at the end
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
    )
    kwargs = dict(scale=head_dim**-0.5, soft_cap=soft_cap, sliding_window=window)
    out = ragged_paged_attention_tpu(
        *args,
        **kwargs,
        num_kv_pages_per_block=pages,
        num_queries_per_block=queries,
        interpret=INTERPRET,
    )
    assert_no_races()
    expected = ragged_paged_attention_reference_tpu(*args, **kwargs)
    assert out.shape == expected.shape and out.dtype == dtype
    out, expected = np.asarray(out, np.float32), np.asarray(expected, np.float32)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == jnp.float32 else dict(rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(out, expected, **tol)
    used = int(args[4][len(seqs)])
    np.testing.assert_array_equal(out[used:], 0.0)  # padding rows are zeros


def test_reference_matches_repo_reference():
    """The pool-layout reference agrees with the engine's reference on split K/V pages."""
    rng = np.random.default_rng(1)
    seqs = mixed_seqs(16, 50)
    q, pool, kv_lens, tables, cu_q_lens, num_seqs = make_batch(
        rng, page_size=16, seqs=seqs, max_seqs=len(seqs) + 1, pages_per_seq=4,
        num_tokens=40, num_q_heads=6, num_kv_heads=3, head_dim=64, dtype=jnp.float32,
    )  # fmt: skip
    assert pool.shape[2] == 2 * padded_num_kv_heads(3, jnp.float32) == 8
    k, v = deinterleave_kv(pool, 3, 64)  # [P, S, Hkv, D]
    kwargs = dict(scale=0.125, soft_cap=3.0, sliding_window=9)
    ours = ragged_paged_attention_reference_tpu(
        q, pool, kv_lens, tables, cu_q_lens, num_seqs, num_kv_heads=3, **kwargs
    )
    theirs = ragged_paged_attention_reference(
        q, k.transpose(2, 0, 1, 3), v.transpose(2, 0, 1, 3), kv_lens, tables, cu_q_lens, num_seqs,
        **kwargs,
    )  # fmt: skip
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-5, atol=1e-5)


def test_attention_padded_kv_heads():
    """Hkv=3 is padded to 4 pool heads; the kernel reads only the real ones."""
    rng = np.random.default_rng(2)
    seqs = [(1, 20), (6, 6)]
    args = make_batch(
        rng, page_size=16, seqs=seqs, max_seqs=2, pages_per_seq=2, num_tokens=8,
        num_q_heads=6, num_kv_heads=3, head_dim=64, dtype=jnp.float32,
    )  # fmt: skip
    out = ragged_paged_attention_tpu(*args, scale=0.125, num_kv_heads=3, interpret=INTERPRET)
    assert_no_races()
    expected = ragged_paged_attention_reference_tpu(*args, scale=0.125, num_kv_heads=3)
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "dtype,num_kv_heads,head_dim", [(jnp.float32, 2, 64), (jnp.bfloat16, 1, 128)]
)
def test_update_kv_cache_matches_reference(dtype, num_kv_heads, head_dim):
    rng = np.random.default_rng(3)
    page_size, num_pages = 16, 6
    pool = jnp.asarray(
        rng.normal(size=kv_pool_shape(num_pages, page_size, num_kv_heads, head_dim, dtype)), dtype
    )
    # Real tokens in shuffled pages (one crosses a page boundary), padding tokens into page 0
    # (two share slot 0), and one out-of-range slot that is skipped.
    slots = np.array([3 * 16 + 15, 5 * 16 + 0, 1 * 16 + 7, 2 * 16 + 2, 0, 0, 5, -1], np.int32)
    new_k = jnp.asarray(rng.normal(size=(len(slots), num_kv_heads, head_dim)), dtype)
    new_v = jnp.asarray(rng.normal(size=(len(slots), num_kv_heads, head_dim)), dtype)
    out = update_kv_cache_tpu(pool, new_k, new_v, jnp.asarray(slots), interpret=INTERPRET)
    assert_no_races()
    expected = update_kv_cache_reference(pool, new_k, new_v, jnp.asarray(slots))
    out, expected, pool = np.asarray(out), np.asarray(expected), np.asarray(pool)
    np.testing.assert_array_equal(out[1:], expected[1:])  # pages 1.. bitwise
    np.testing.assert_array_equal(out[0, 1:], expected[0, 1:])  # page 0 except the shared slot
    shared = [interleave_kv(new_k[t], new_v[t]) for t in (4, 5)]
    assert any(np.array_equal(out[0, 0], np.asarray(row)) for row in shared)
    written = {(int(s) // page_size, int(s) % page_size) for s in slots if s >= 0}
    untouched = np.ones(pool.shape[:2], bool)
    for page, offset in written:
        untouched[page, offset] = False
    np.testing.assert_array_equal(out[untouched], pool[untouched])
    k, v = deinterleave_kv(out.reshape(-1, *out.shape[2:])[slots[:4]], num_kv_heads, head_dim)
    np.testing.assert_array_equal(np.asarray(k), np.asarray(new_k[:4]))
    np.testing.assert_array_equal(np.asarray(v), np.asarray(new_v[:4]))


def _valid_args(dtype=jnp.float32):
    pool = jnp.zeros(kv_pool_shape(9, 16, 2, 64, dtype), dtype)
    return dict(
        q=jnp.zeros((8, 4, 64), dtype),
        kv_pages=pool,
        kv_lens=jnp.zeros(4, jnp.int32),
        block_tables=jnp.zeros((4, 2), jnp.int32),
        cu_q_lens=jnp.zeros(5, jnp.int32),
        num_seqs=jnp.zeros(1, jnp.int32),
    )


@pytest.mark.parametrize(
    "change,kwargs,match",
    [
        (dict(q=jnp.zeros((8, 4, 64, 1))), {}, "q"),
        (dict(q=jnp.zeros((8, 4, 64), jnp.float16)), {}, "q"),
        (dict(q=jnp.zeros((8, 3, 64))), {}, "num_kv_heads"),
        (dict(q=jnp.zeros((8, 4, 192))), {}, "head_dim"),
        (dict(kv_pages=jnp.zeros((9, 16, 6, 128))), {}, "kv_pages"),
        (dict(kv_pages=jnp.zeros((9, 12, 4, 128))), {}, "page_size"),
        (dict(kv_pages=jnp.zeros((9, 512, 4, 128))), {}, "page_size"),
        (dict(kv_pages=jnp.zeros((9, 16, 4, 128), jnp.bfloat16)), {}, "kv_pages dtype"),
        (dict(kv_lens=jnp.zeros(4, jnp.float32)), {}, "kv_lens"),
        (dict(kv_lens=jnp.zeros(3, jnp.int32)), {}, "kv_lens"),
        (dict(block_tables=jnp.zeros(8, jnp.int32)), {}, "block_tables"),
        (dict(cu_q_lens=jnp.zeros(4, jnp.int32)), {}, "cu_q_lens"),
        (dict(num_seqs=jnp.zeros(2, jnp.int32)), {}, "num_seqs"),
        ({}, dict(soft_cap=0.0), "soft_cap"),
        ({}, dict(sliding_window=0), "sliding_window"),
        ({}, dict(num_kv_pages_per_block=3), "num_kv_pages_per_block"),
        ({}, dict(num_queries_per_block=12), "num_queries_per_block"),
        ({}, dict(vmem_limit_bytes=0), "vmem_limit_bytes"),
    ],
)
def test_attention_rejects_bad_inputs(change, kwargs, match):
    args = _valid_args() | change
    with pytest.raises(ValueError, match=match):
        ragged_paged_attention_tpu(**args, scale=1.0, **kwargs)


def test_bf16_page_size_must_fill_packed_tiles():
    args = _valid_args(jnp.bfloat16)
    args["kv_pages"] = jnp.zeros((9, 24, 4, 128), jnp.bfloat16)
    with pytest.raises(ValueError, match="page_size"):
        ragged_paged_attention_tpu(**args, scale=1.0)


def test_update_rejects_bad_inputs():
    pool = jnp.zeros(kv_pool_shape(4, 16, 2, 64, jnp.float32))
    k = jnp.zeros((3, 2, 64))
    slots = jnp.zeros(3, jnp.int32)
    with pytest.raises(ValueError, match="slot_mapping"):
        update_kv_cache_tpu(pool, k, k, slots.astype(jnp.float32))
    with pytest.raises(ValueError, match="new_v"):
        update_kv_cache_tpu(pool, k, k[:2], slots)
    with pytest.raises(ValueError, match="new_k"):
        update_kv_cache_tpu(pool, jnp.zeros((3, 3, 64)), jnp.zeros((3, 3, 64)), slots)
    with pytest.raises(ValueError, match="kv_pages"):
        update_kv_cache_tpu(pool[0], k, k, slots)


# --- AOT Mosaic compiles for a v5e chip (no TPU needed, libtpu is) ---------------------------

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None, reason="libtpu not installed: no Mosaic compiler"
)


@pytest.fixture(scope="module")
def v5e_mesh():
    from jax.experimental import topologies

    topology = topologies.get_topology_desc(
        platform="tpu", topology_name="v5e:1x1", chips_per_host_bounds=(1, 1, 1)
    )
    return jax.sharding.Mesh(np.array(topology.devices[:1]), ("x",))


def _compile(mesh, fn, *shapes, **jit_kwargs):
    start = time.perf_counter()
    with jax.set_mesh(mesh):
        compiled = jax.jit(fn, **jit_kwargs).trace(*shapes).lower().compile()
    return compiled, time.perf_counter() - start


# Llama-3-8B on v5e-4, per chip: 8 query heads, 2 KV heads, D=128, bf16, page 16, ~10 GB pool.
ENGINE = dict(num_q_heads=8, num_kv_heads=2, head_dim=128, page_size=16, dtype=jnp.bfloat16)


@needs_libtpu
@pytest.mark.tpu_compile
@pytest.mark.parametrize(
    "num_tokens,max_seqs,pages_per_seq",
    [pytest.param(64, 64, 128, id="decode-64x2048"), pytest.param(2048, 16, 128, id="prefill")],
)
def test_attention_aot_compile_v5e(v5e_mesh, num_tokens, max_seqs, pages_per_seq):
    e = ENGINE
    page_shape = kv_pool_shape(1, e["page_size"], e["num_kv_heads"], e["head_dim"], e["dtype"])
    page_bytes = int(np.prod(page_shape)) * jnp.dtype(e["dtype"]).itemsize
    pool_shape = kv_pool_shape(
        10 * 2**30 // page_bytes, e["page_size"], e["num_kv_heads"], e["head_dim"], e["dtype"]
    )
    i32 = jnp.int32
    shapes = [
        jax.ShapeDtypeStruct((num_tokens, e["num_q_heads"], e["head_dim"]), e["dtype"]),
        jax.ShapeDtypeStruct(pool_shape, e["dtype"]),
        jax.ShapeDtypeStruct((max_seqs,), i32),
        jax.ShapeDtypeStruct((max_seqs, pages_per_seq), i32),
        jax.ShapeDtypeStruct((max_seqs + 1,), i32),
        jax.ShapeDtypeStruct((1,), i32),
    ]
    fn = functools.partial(ragged_paged_attention_tpu, scale=e["head_dim"] ** -0.5)
    compiled, seconds = _compile(v5e_mesh, fn, *shapes)
    measured = compiled.cost_analysis()["bytes accessed"]
    estimate = attention_cost(
        num_tokens, e["num_q_heads"], e["head_dim"], pool_shape, 2, max_seqs, pages_per_seq
    ).bytes_accessed
    kv_floor = min(max_seqs, num_tokens) * pages_per_seq * page_bytes
    temp = compiled.memory_analysis().temp_size_in_bytes
    print(
        f"\nrpa v5e T={num_tokens} seqs={max_seqs} pages/seq={pages_per_seq} pool={pool_shape}: "
        f"compile {seconds:.1f}s, bytes accessed {measured:.4g}, estimate {estimate:.4g} "
        f"(KV {kv_floor:.4g}), ratio {measured / estimate:.3f}, temp {temp} B"
    )
    assert measured <= 1.25 * estimate
    assert estimate - kv_floor <= 0.1 * kv_floor or num_tokens > max_seqs  # decode: KV dominates
    assert temp < 64 * 2**20  # the pool is never copied


@needs_libtpu
@pytest.mark.tpu_compile
def test_update_aot_compile_v5e(v5e_mesh):
    e = ENGINE
    pool_shape = kv_pool_shape(
        655_360, e["page_size"], e["num_kv_heads"], e["head_dim"], e["dtype"]
    )
    num_tokens = 64
    shapes = [
        jax.ShapeDtypeStruct(pool_shape, e["dtype"]),
        jax.ShapeDtypeStruct((num_tokens, e["num_kv_heads"], e["head_dim"]), e["dtype"]),
        jax.ShapeDtypeStruct((num_tokens, e["num_kv_heads"], e["head_dim"]), e["dtype"]),
        jax.ShapeDtypeStruct((num_tokens,), jnp.int32),
    ]
    compiled, seconds = _compile(v5e_mesh, update_kv_cache_tpu, *shapes, donate_argnums=0)
    measured = compiled.cost_analysis()["bytes accessed"]
    row_bytes = int(np.prod(pool_shape[2:])) * 2
    print(
        f"\nkv update v5e T={num_tokens} pool={pool_shape}: compile {seconds:.1f}s, "
        f"bytes accessed {measured:.4g} (rows written {num_tokens * row_bytes})"
    )
    assert measured < 8 * num_tokens * row_bytes  # rows, not the 10 GB pool
    assert compiled.memory_analysis().temp_size_in_bytes < 2**20


@needs_libtpu
@pytest.mark.tpu_compile
@pytest.mark.parametrize(
    "dtype,num_q_heads,num_kv_heads,head_dim,page_size,num_tokens,extras",
    [
        (jnp.bfloat16, 1, 1, 64, 16, 8, {}),
        pytest.param(
            jnp.bfloat16,
            32,
            8,
            128,
            256,
            256,
            dict(soft_cap=30.0, sliding_window=1024),
            marks=pytest.mark.slow,
        ),
        (jnp.float32, 12, 3, 64, 32, 40, dict(num_kv_heads=3)),
        (jnp.float32, 16, 2, 256, 16, 512, dict(num_queries_per_block=32)),
    ],
)
def test_attention_aot_compile_configs(
    v5e_mesh, dtype, num_q_heads, num_kv_heads, head_dim, page_size, num_tokens, extras
):
    """Mosaic lowers the kernel across dtypes, group sizes, head dims and page sizes."""
    max_seqs, pages_per_seq = 8, 16
    pool_shape = kv_pool_shape(1024, page_size, num_kv_heads, head_dim, dtype)
    i32 = jnp.int32
    shapes = [
        jax.ShapeDtypeStruct((num_tokens, num_q_heads, head_dim), dtype),
        jax.ShapeDtypeStruct(pool_shape, dtype),
        jax.ShapeDtypeStruct((max_seqs,), i32),
        jax.ShapeDtypeStruct((max_seqs, pages_per_seq), i32),
        jax.ShapeDtypeStruct((max_seqs + 1,), i32),
        jax.ShapeDtypeStruct((1,), i32),
    ]
    fn = functools.partial(ragged_paged_attention_tpu, scale=0.1, **extras)
    compiled, seconds = _compile(v5e_mesh, fn, *shapes)
    print(f"\nrpa v5e {jnp.dtype(dtype).name} Hq={num_q_heads} Hkv={num_kv_heads} "
          f"D={head_dim} S={page_size} T={num_tokens}: compile {seconds:.1f}s")  # fmt: skip
