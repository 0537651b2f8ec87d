"""The native CPU decode kernel against the pure-JAX reference (shuffled page tables, lengths
straddling page boundaries, empty rows, GQA/MQA/MHA, soft cap, sliding window) and in the
engine, where ``attention_backend="auto"`` picks it on CPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgen.backends import resolve_backend_name as resolve_backend
from jaxgen.backends.cpu_kernels import cpu_kernel_available, paged_attention_cpu
from pallas_kernels import paged_attention_reference
from tests.kernels.test_paged_attention import boundary_lengths, make_batch

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "cpu" or not cpu_kernel_available(),
    reason="needs the CPU backend and a C++ compiler",
)


@pytest.mark.parametrize(
    "num_heads, num_kv_heads, head_dim, page_size, soft_cap, sliding_window",
    [
        (9, 3, 64, 16, None, None),  # SmolLM2's GQA shape
        (4, 4, 32, 8, None, None),  # MHA
        (8, 1, 128, 4, 30.0, None),  # MQA, soft cap
        (8, 2, 64, 8, None, 11),  # sliding window shorter than some rows
        (6, 2, 16, 1, 2.0, 5),  # one-token pages
        (6, 3, 80, 8, None, 7),  # head_dim past one 64-column chunk of the vector path
        (4, 2, 20, 4, None, None),  # head_dim not a multiple of 8: the portable loops
    ],
)
def test_matches_reference(num_heads, num_kv_heads, head_dim, page_size, soft_cap, sliding_window):
    rng = np.random.default_rng(num_heads * 100 + page_size)
    args = make_batch(
        rng,
        boundary_lengths(page_size) + [3 * page_size],
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        page_size=page_size,
        spare_pages=2,
    )
    opts = dict(soft_cap=soft_cap, sliding_window=sliding_window)
    actual = np.asarray(paged_attention_cpu(*args, **opts))
    expected = np.asarray(paged_attention_reference(*args, **opts))
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=2e-6)
    assert not np.any(actual[4]), "length-0 row must be zeros"


def test_inside_jit_with_scale_and_many_rows():
    """Enough rows to spread over the thread pool; called twice inside one jitted function."""
    rng = np.random.default_rng(5)
    lengths = rng.integers(0, 70, 97)
    args = make_batch(rng, lengths, num_heads=6, num_kv_heads=3, head_dim=64, page_size=16)

    @jax.jit
    def twice(q, k_pages, v_pages, lengths, tables):
        first = paged_attention_cpu(q, k_pages, v_pages, lengths, tables, scale=0.3)
        return first + paged_attention_cpu(2 * q, k_pages, v_pages, lengths, tables, scale=0.3)

    q, k_pages, v_pages, lens, tables = args
    expected = paged_attention_reference(*args, scale=0.3) + paged_attention_reference(
        2 * q, k_pages, v_pages, lens, tables, scale=0.3
    )
    np.testing.assert_allclose(np.asarray(twice(*args)), np.asarray(expected), atol=1e-5)


def test_rejects_non_float32():
    args = make_batch(
        np.random.default_rng(0), [3], num_heads=2, num_kv_heads=1, head_dim=8, page_size=4
    )
    q, k_pages, v_pages, lengths, tables = args
    with pytest.raises(ValueError, match="k_pages"):
        paged_attention_cpu(
            q, k_pages.astype(jnp.bfloat16), v_pages.astype(jnp.bfloat16), lengths, tables
        )
    with pytest.raises(ValueError, match="lengths"):
        paged_attention_cpu(q, k_pages, v_pages, lengths.astype(jnp.float32), tables)


def test_auto_backend_selection():
    assert resolve_backend("auto") == "cpu"
    assert resolve_backend("auto", dtype=jnp.bfloat16) == "reference"
    assert resolve_backend("auto", sharded=True) == "reference"
    assert resolve_backend("cpu", sharded=True) == "cpu"  # tensor parallel: asked for by name
    with pytest.raises(ValueError, match="attention_backend"):
        resolve_backend("cpu", dtype=jnp.bfloat16)


def test_engine_greedy_output_same_as_reference_backend(tiny_model_dir):
    from jaxgen import LLM, SamplingParams

    prompts = [list(range(3, 3 + n)) for n in (5, 17, 33, 2)]
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    outputs = {}
    for backend in ("reference", "cpu"):
        llm = LLM(tiny_model_dir, attention_backend=backend, page_size=4, max_model_len=64)
        result = llm.generate(prompts, params, use_tqdm=False)
        outputs[backend] = [o.outputs[0].token_ids for o in result]
    assert outputs["cpu"] == outputs["reference"]


def quantized_pool(pages, dtype):
    """``pages`` ([Hkv, P, S, D] float) written token by token into an 8-bit pool."""
    from jaxgen.quantization import kv_cache

    hkv, num_pages, page_size, dim = pages.shape
    pool = kv_cache.zeros(dtype, pages.shape, jnp.float32)
    tokens = jnp.swapaxes(pages.reshape(hkv, num_pages * page_size, dim), 0, 1)  # [P*S, Hkv, D]
    return kv_cache.write(pool, tokens, jnp.arange(num_pages * page_size, dtype=jnp.int32))


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
@pytest.mark.parametrize(
    "num_heads, num_kv_heads, head_dim, page_size, soft_cap, sliding_window",
    [
        (9, 3, 64, 16, None, None),  # SmolLM2's GQA shape: one scale per head
        pytest.param(8, 1, 128, 4, 30.0, None, marks=pytest.mark.slow),  # MQA, soft cap
        (4, 1, 256, 4, None, None),  # two scale groups per head (a 256-wide head)
        (8, 2, 40, 8, None, 11),  # one scale per head (40 is no multiple of 128), window
        (4, 2, 20, 4, None, None),  # head_dim not a multiple of 8: the portable loops
    ],
)
def test_quantized_pool_matches_reference_on_dequantised_pages(
    dtype, num_heads, num_kv_heads, head_dim, page_size, soft_cap, sliding_window
):
    """The 8-bit kernel reads codes and scales; the reference attends over the same pool
    dequantised (``QuantizedPages.gather``), so they agree to float rounding."""

    rng = np.random.default_rng(head_dim + page_size)
    q, k_pages, v_pages, lengths, tables = make_batch(
        rng,
        boundary_lengths(page_size) + [3 * page_size],
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        page_size=page_size,
        spare_pages=2,
    )
    k_pool, v_pool = quantized_pool(k_pages * 3.0, dtype), quantized_pool(v_pages, dtype)
    every_page = jnp.arange(k_pages.shape[1], dtype=jnp.int32)
    dequantised = (k_pool.gather(every_page), v_pool.gather(every_page))
    opts = dict(soft_cap=soft_cap, sliding_window=sliding_window)
    actual = np.asarray(paged_attention_cpu(q, k_pool, v_pool, lengths, tables, **opts))
    expected = paged_attention_reference(q, *dequantised, lengths, tables, **opts)
    np.testing.assert_allclose(actual, np.asarray(expected), rtol=1e-5, atol=3e-6)
    assert not np.any(actual[4]), "length-0 row must be zeros"
    exact = np.asarray(
        paged_attention_reference(q, k_pages * 3.0, v_pages, lengths, tables, **opts)
    )
    assert np.abs(actual - exact).max() < (0.1 if dtype == "int8" else 0.5)  # 8 bits, not garbage


def test_quantized_pool_rejects_bad_input():
    from jaxgen.quantization.kv_cache import QuantizedPages

    q, k_pages, v_pages, lengths, tables = make_batch(
        np.random.default_rng(0), [3], num_heads=2, num_kv_heads=1, head_dim=64, page_size=4
    )
    k_pool, v_pool = quantized_pool(k_pages, "int8"), quantized_pool(v_pages, "fp8")
    with pytest.raises(ValueError, match="k_pages and v_pages must share"):
        paged_attention_cpu(q, k_pool, v_pool, lengths, tables)
    bad = QuantizedPages(k_pool.values, k_pool.scales.astype(jnp.float32))  # not the bits
    with pytest.raises(ValueError, match=r"k_pages\.scales"):
        paged_attention_cpu(q, bad, bad, lengths, tables)
