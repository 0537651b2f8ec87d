"""The GPU ragged paged-attention kernels (``pallas_kernels/gpu/ragged_paged_attention``) against
the float32 reference: compiled Triton kernels on a GPU, Pallas's interpreter elsewhere. Mixed
decode and prefill rows in one call, shuffled page tables, lengths straddling pages, padding rows
and sequence slots, split-KV, both decode paths, float and 8-bit pools, decode-only steps; the
wrapper's ValueErrors; the engine's greedy tokens. Their lowering for CUDA:
``test_ragged_paged_attention_gpu_lowering.py``."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import ragged_paged_attention_gpu, ragged_paged_attention_reference
from pallas_kernels.gpu.ragged_paged_attention import decode_sizes, prefill_sizes
from tests.kernels.test_paged_attention_cpu import quantized_pool
from tests.kernels.test_ragged_paged_attention import make_batch

INTERPRET = jax.default_backend() != "gpu"
TOLERANCE = {
    jnp.float32: dict(rtol=1e-5, atol=2e-5),
    jnp.bfloat16: dict(rtol=2e-2, atol=2e-2),
    jnp.float16: dict(rtol=5e-3, atol=5e-3),
}
# The interpreter's XLA:CPU programs are large; built at optimisation level 0 they compile in
# about half the time, and their speed is not what these tests check.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
PAGE = 8
# Decode rows of 1, page - 1, page, page + 1 and 43 keys between prefill chunks: one after a
# 3-token context, a 17-token prompt, and 9 tokens after page - 1 cached ones.
Q_LENS = [1, 5, 1, 1, 17, 1, 9, 1]
CONTEXTS = [0, 3, PAGE - 2, PAGE - 1, 0, PAGE, PAGE - 1, 5 * PAGE + 2]


def attend(*args, **options):
    """The kernels on ``args``: compiled on a GPU, interpreted (see ``FAST_COMPILE``) elsewhere."""
    if not INTERPRET:
        return ragged_paged_attention_gpu(*args, **options)
    lowered = ragged_paged_attention_gpu.trace(*args, interpret=True, **options).lower()
    return lowered.compile(FAST_COMPILE)(*args)


def reference(*args, **options):
    """The float32 reference on ``args``, jitted (on CPU as ``FAST_COMPILE`` says)."""
    call = jax.jit(functools.partial(ragged_paged_attention_reference, **options))
    return call.trace(*args).lower().compile(FAST_COMPILE if INTERPRET else None)(*args)


def kernel_grids(args, **options) -> dict[str, tuple]:
    """The grid of each ``pallas_call`` the wrapper makes, by kernel name."""
    jaxpr = jax.make_jaxpr(
        functools.partial(ragged_paged_attention_gpu, interpret=True, **options)
    )(*args)
    grids = {}

    def visit(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "pallas_call":
                grids[eqn.params["name"]] = eqn.params["grid_mapping"].grid
            for value in eqn.params.values():
                inner = getattr(value, "jaxpr", value)
                if hasattr(inner, "eqns"):
                    visit(inner)

    visit(jaxpr.jaxpr)
    return grids


def mixed_batch(seed, *, group, num_kv_heads=2, head_dim, dtype, pool="float"):
    """The mixed step of ``Q_LENS`` / ``CONTEXTS`` (two unused sequence slots with garbage
    ``cu_q_lens`` entries, three padding rows), its pool float or 8-bit (then the reference
    gets the pool dequantised)."""
    args = make_batch(
        np.random.default_rng(seed),
        Q_LENS,
        CONTEXTS,
        num_heads=group * num_kv_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        page_size=PAGE,
        dtype=jnp.float32 if pool in ("int8", "fp8") else dtype,
        padding_seqs=2,
    )
    if pool == "float":
        return args, args
    q, k_pages, v_pages, *metadata = args
    k_pool, v_pool, k_dequantised, v_dequantised = _quantized(k_pages, v_pages, pool)
    q = q.astype(dtype)
    return (q, k_pool, v_pool, *metadata), (q, k_dequantised, v_dequantised, *metadata)


@functools.partial(jax.jit, static_argnames="kind")
def _quantized(k_pages, v_pages, kind):
    """The float pools written into 8-bit ones, and those read back as float32 (one compile:
    op by op, these cost seconds)."""
    k_pool, v_pool = quantized_pool(k_pages, kind), quantized_pool(v_pages, kind)
    every_page = jnp.arange(k_pages.shape[1], dtype=jnp.int32)
    return k_pool, v_pool, k_pool.gather(every_page), v_pool.gather(every_page)


def check(args, reference_args, *, dtype, options, tuning=None):
    actual = attend(*args, **options, **(tuning or {}))
    expected = reference(*reference_args, **options)
    assert actual.dtype == dtype and actual.shape == args[0].shape
    np.testing.assert_allclose(
        np.asarray(actual, np.float32), np.asarray(expected, np.float32), **TOLERANCE[dtype]
    )
    assert not np.any(np.asarray(actual[sum(Q_LENS) :], np.float32)), "padding rows: zeros"


MIXED_CASES = {
    # head_dim 96 on 128 lanes; a window and a soft cap; three decode splits over 8-key blocks
    # (the 43-key row has 6); the group of 4 scored without the MMA units (the lane-sum path).
    "hd96-window-softcap-3-splits": dict(
        group=4,
        head_dim=96,
        dtype=jnp.float32,
        options=dict(soft_cap=3.0, sliding_window=11, scale=0.2),
        tuning=dict(decode_dot=False, num_splits=3, decode_block_k=8),
    ),
    # GQA 8: the MMA decode path, the default (16 rows); the default split count.
    "gqa8-bf16-defaults": dict(group=8, head_dim=128, dtype=jnp.bfloat16),
    # An int8 pool (one scale per head), the MMA path forced on a group of 4, one split (decode
    # rows written straight into the output).
    "int8-dot-1-split": dict(
        group=4,
        head_dim=64,
        dtype=jnp.float32,
        pool="int8",
        options=dict(soft_cap=5.0, sliding_window=5),
        tuning=dict(decode_dot=True, num_splits=1),
    ),
    # An fp8 pool at head_dim 256 (two scale groups per head), MHA (one row per program).
    "fp8-hd256-mha": dict(
        group=1, head_dim=256, dtype=jnp.bfloat16, pool="fp8", tuning=dict(prefill_block_q=16)
    ),
}


@pytest.mark.parametrize("case", MIXED_CASES)
def test_mixed_step_matches_reference(case):
    case = dict(MIXED_CASES[case])
    options, tuning = case.pop("options", {}), case.pop("tuning", {})
    args, reference_args = mixed_batch(case["group"] * 1000 + case["head_dim"], **case)
    check(args, reference_args, dtype=case["dtype"], options=options, tuning=tuning)


DECODE_ONLY_CASES = {
    # The default splits (more than the short rows' key blocks: most splits see no key), GQA 4.
    "bf16-default-splits": dict(dtype=jnp.bfloat16, tuning={}),
    # One split: the decode kernel writes every row itself; a window.
    "f32-1-split-window": dict(
        dtype=jnp.float32, options=dict(sliding_window=9), tuning=dict(num_splits=1)
    ),
    # Three splits of 8-key blocks on the lane-sum path, an int8 pool and a soft cap.
    "int8-3-splits-softcap": dict(
        dtype=jnp.float32,
        pool="int8",
        options=dict(soft_cap=4.0),
        tuning=dict(decode_dot=False, num_splits=3, decode_block_k=8),
    ),
}


def decode_only_batch(dtype):
    """Six decode sequences (keys 1, page - 1, page, page + 1, 43, 100; GQA 4, head_dim 64) in
    eight sequence slots, one row each: two empty slots, two padding rows."""
    return make_batch(
        np.random.default_rng(7),
        [1] * 6,
        [0, PAGE - 2, PAGE - 1, PAGE, 42, 99],
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        page_size=PAGE,
        dtype=dtype,
        padding_rows=2,
        padding_seqs=2,
    )


@pytest.mark.parametrize("case", DECODE_ONLY_CASES)
def test_decode_only_step_matches_reference(case):
    """A decode-only step (one row per sequence slot: keys 1, page - 1, page, page + 1, 43, 100;
    two empty slots): the decode kernel (and the split merge) alone give every row, the empty
    slots' as zeros."""
    case = dict(DECODE_ONLY_CASES[case])
    dtype, pool = case["dtype"], case.get("pool", "float")
    args = decode_only_batch(jnp.float32 if pool != "float" else dtype)
    reference_args = args
    if pool != "float":
        q, k_pages, v_pages, *metadata = args
        k_pool, v_pool, k_dequantised, v_dequantised = _quantized(k_pages, v_pages, pool)
        args = (q, k_pool, v_pool, *metadata)
        reference_args = (q, k_dequantised, v_dequantised, *metadata)
    options = case.get("options", {})
    actual = attend(*args, decode_only=True, **options, **case["tuning"])
    expected = reference(*reference_args, **options)
    np.testing.assert_allclose(
        np.asarray(actual, np.float32), np.asarray(expected, np.float32), **TOLERANCE[dtype]
    )
    assert not np.any(np.asarray(actual[6:], np.float32)), "empty slots: zeros"
    with pytest.raises(ValueError, match="decode_only needs one row per sequence slot"):
        ragged_paged_attention_gpu(args[0][:7], *args[1:], decode_only=True, interpret=True)


def test_split_kv_is_exercised():
    """The decode grid has the requested splits (the step's long row spans all of them), and
    the default gives a batch-1 step's 2 sequence slots x 8 KV heads about 4 programs per SM."""
    args, _ = mixed_batch(0, group=4, head_dim=96, dtype=jnp.float32)
    grids = kernel_grids(args, decode_dot=False, num_splits=3, decode_block_k=8)
    assert grids["ragged_paged_attention_decode"] == (10, 2, 3)  # (slots, KV heads, splits)
    assert grids["ragged_paged_attention_prefill"][1] == 2
    batch1 = decode_sizes(group=4, head_dim=128, max_seqs=2, num_kv_heads=8, max_keys=32768)
    # The default is the MMA path: a group of 4 padded to tl.dot's 16 rows, 64-key blocks.
    assert batch1.use_dot and batch1.rows == 16 and batch1.block_k == 64
    assert batch1.num_splits == 33 and 2 * 8 * batch1.num_splits >= 4 * 132
    lane_sum = decode_sizes(
        group=4, head_dim=128, max_seqs=2, num_kv_heads=8, max_keys=32768, use_dot=False
    )
    assert not lane_sum.use_dot and lane_sum.rows == 4 and lane_sum.block_k == 16
    assert lane_sum.num_splits == 33
    batch64 = decode_sizes(group=4, head_dim=128, max_seqs=64, num_kv_heads=8, max_keys=4096)
    assert batch64.num_splits == 1
    gqa8 = decode_sizes(group=8, head_dim=128, max_seqs=8, num_kv_heads=8, max_keys=4096)
    assert gqa8.use_dot and gqa8.rows == 16
    # Short tables cap the splits at their key blocks (batch 1 x 1k keys: 16 blocks of 64).
    short = decode_sizes(group=4, head_dim=128, max_seqs=1, num_kv_heads=8, max_keys=1024)
    assert short.num_splits == 16
    assert prefill_sizes(group=4, head_dim=128).rows == 128
    assert prefill_sizes(group=4, head_dim=256).rows == 64


SWEEP_POOLS = [
    ("float", jnp.float32),
    ("float", jnp.bfloat16),
    ("int8", jnp.bfloat16),
    ("fp8", jnp.float32),
    ("float", jnp.float16),
]


@pytest.mark.slow
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_sweep_matches_reference(head_dim, group):
    """Every head_dim x GQA group, each with another pool dtype, decode path and option."""
    index = 3 * [64, 96, 128, 256].index(head_dim) + [1, 4, 8].index(group)
    pool, dtype = SWEEP_POOLS[index % len(SWEEP_POOLS)]
    options = [{}, dict(soft_cap=4.0), dict(sliding_window=9), dict(scale=0.3)][index % 4]
    tuning = dict(decode_dot=bool(index % 2), num_splits=1 + index % 3)
    args, reference_args = mixed_batch(
        index, group=group, head_dim=head_dim, dtype=dtype, pool=pool
    )
    check(args, reference_args, dtype=dtype, options=options, tuning=tuning)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_long_rows_llama_shapes(dtype):
    """Llama-3-8B heads (32 / 8, head_dim 128, pages of 16): prompts of hundreds of tokens and
    long decode rows, default sizes, with and without a window."""
    rng = np.random.default_rng(13)
    args = make_batch(
        rng,
        [130, 1, 64, 1, 37, 1],
        [0, 700, 129, 255, 17, 1],
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        page_size=16,
        dtype=dtype,
    )
    for sliding_window in (None, 100):
        actual = attend(*args, sliding_window=sliding_window)
        expected = reference(*args, sliding_window=sliding_window)
        np.testing.assert_allclose(
            np.asarray(actual, np.float32), np.asarray(expected, np.float32), **TOLERANCE[dtype]
        )


def _bad_inputs():
    from jaxgen.quantization.kv_cache import QuantizedPages

    q = jnp.zeros((6, 4, 64), jnp.float32)
    pages = jnp.zeros((2, 5, 8, 64), jnp.float32)
    codes = jnp.zeros((2, 5, 8, 64), jnp.int8)
    scales = jnp.zeros((2, 5, 8, 1), jnp.uint16)
    tables = jnp.zeros((2, 3), jnp.int32)
    good = dict(
        q=q,
        k_pages=pages,
        v_pages=pages,
        kv_lens=jnp.zeros((2,), jnp.int32),
        block_tables=tables,
        cu_q_lens=jnp.asarray([0, 3, 6], jnp.int32),
        num_seqs=jnp.asarray([2], jnp.int32),
    )
    wide = jnp.zeros((2, 5, 8, 512), jnp.float32)

    def pool(values, group_scales):
        pages = QuantizedPages(values, group_scales)
        return dict(good, k_pages=pages, v_pages=pages)

    return [
        ("q", dict(good, q=q[0])),
        ("q heads", dict(good, q=jnp.zeros((6, 3, 64)))),
        ("head_dim", dict(good, q=jnp.zeros((6, 4, 512)), k_pages=wide, v_pages=wide)),
        ("head_dim", dict(good, q=jnp.zeros((6, 4, 128)))),
        ("k_pages", dict(good, k_pages=pages[0])),
        ("v_pages", dict(good, v_pages=pages[:1])),
        ("k_pages", pool(codes.astype(jnp.int16), scales)),  # no 8-bit pool
        ("k_pages", pool(codes.astype(jnp.float8_e4m3fn), scales)),  # fp8 must be uint8 bits
        ("k_pages.scales", pool(codes, scales.astype(jnp.float32))),
        ("k_pages.scales", pool(codes, jnp.zeros((2, 5, 8, 3), jnp.uint16))),  # 3 groups of 64
        ("kv_lens", dict(good, kv_lens=jnp.zeros((3,), jnp.int32))),
        ("kv_lens", dict(good, kv_lens=jnp.zeros((2,), jnp.float32))),
        ("block_tables", dict(good, block_tables=tables[0])),
        ("block_tables", dict(good, block_tables=tables.astype(jnp.uint32))),
        ("cu_q_lens", dict(good, cu_q_lens=good["cu_q_lens"][:2])),
        ("num_seqs", dict(good, num_seqs=jnp.asarray(2, jnp.int32))),
        ("sliding_window", dict(good, sliding_window=0)),
        ("soft_cap", dict(good, soft_cap=-1.0)),
        ("num_splits", dict(good, num_splits=0)),
        ("decode_block_k", dict(good, decode_block_k=12)),
        ("decode_block_k", dict(good, decode_block_k=8, decode_dot=True)),
        ("prefill_block_q", dict(good, prefill_block_q=3)),
        ("prefill_block_q", dict(good, prefill_block_q=2)),  # 2 tokens x 2 heads < 16 rows
        ("prefill_block_k", dict(good, prefill_block_k=8)),
    ]


@pytest.mark.parametrize("name, inputs", _bad_inputs())
def test_wrapper_rejects_bad_inputs_before_lowering(name, inputs):
    with pytest.raises(ValueError, match=name):
        ragged_paged_attention_gpu.trace(**inputs, interpret=INTERPRET)


def test_backend_refuses_a_platform_it_cannot_run_on():
    from jaxgen.backends import PallasGPUBackend, select_backend

    with pytest.raises(ValueError, match="attention_backend='pallas-gpu'"):
        select_backend("pallas-gpu", platform="tpu")
    assert select_backend("pallas-gpu", platform="cpu").interpret
    assert not select_backend("pallas-gpu", platform="gpu").interpret
    with pytest.raises(ValueError, match="attention_kernel_options"):
        PallasGPUBackend(tuning=(("block_q", 8),))


@pytest.mark.slow
def test_engine_greedy_tokens_same_as_reference_backend(tiny_model_dir):
    """The tiny Llama (GQA 4/2) through the engine, prompts chunked 16 tokens a step beside the
    decode rows (mixed steps): the pallas-gpu backend's greedy tokens are the reference
    backend's, with a float pool (one step a call, 4 decode steps in one multi-step call, and the
    one-kernel split merge and K/V write and cuBLAS's matmuls through
    ``attention_kernel_options``) and with an int8 pool."""
    from jaxgen import LLM, SamplingParams
    from jaxgen.loaders import load_model

    loaded = load_model(tiny_model_dir)
    prompts = [list(range(100, 140)), list(range(7, 30)), list(range(300, 303))]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    outputs = {}
    # the one-kernel split merge and K/V write, cuBLAS's matmuls (XLA's option, on CPU too)
    merge = dict(pallas_merge=True, num_splits=3, pallas_kv_write=True, xla_gemm="cublas")
    for backend, kv_cache_dtype, steps, options in (
        ("reference", "auto", 1, None),
        ("pallas-gpu", "auto", 1, None),
        ("pallas-gpu", "auto", 4, None),
        ("pallas-gpu", "auto", 1, merge),
        ("reference", "int8", 1, None),
        ("pallas-gpu", "int8", 1, None),
    ):
        llm = LLM(
            loaded,
            max_model_len=128,
            kv_cache_memory=4 << 20,
            page_size=8,
            max_rolling_batch_prefill_tokens=16,
            max_rolling_batch_size=4,
            attention_backend=backend,
            kv_cache_dtype=kv_cache_dtype,
            num_scheduler_steps=steps,
            attention_kernel_options=options,
        )
        assert llm.engine.runner.backend.name == backend
        result = llm.generate(prompts, params, use_tqdm=False)
        outputs[backend, kv_cache_dtype, steps, bool(options)] = [o.token_ids for o in result]
    reference, reference_int8 = (
        outputs["reference", "auto", 1, False],
        outputs["reference", "int8", 1, False],
    )
    assert outputs["pallas-gpu", "auto", 1, False] == reference
    assert outputs["pallas-gpu", "auto", 4, False] == reference
    assert outputs["pallas-gpu", "auto", 1, True] == reference
    assert outputs["pallas-gpu", "int8", 1, False] == reference_int8
