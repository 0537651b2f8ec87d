"""The quantised streamed matmul (int8 / int4 codes and scales streamed from HBM, dequantised in
VMEM) against ``x @ dequantize()`` in TPU interpret mode, its input checks, and the pallas-tpu
decode step with quantised weights compiled for v5e: the counted bytes shrink with the codes."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from jaxgen.backends.streamed_quantized_weight import StreamedQuantizedWeight
from jaxgen.config import ModelConfig
from jaxgen.quantization.quantize import QuantizationSpec, quantize_kernel
from pallas_kernels.tpu.streamed_matmul_quantized import streamed_matmul_quantized_tpu
from tests.test_pallas_tpu_backend import LLAMA3_8B, needs_libtpu

SPECS = [
    pytest.param(QuantizationSpec(kind="int8", group_size=32), id="int8-g32"),
    pytest.param(QuantizationSpec(kind="int4", group_size=32, asymmetric=True), id="int4-g32-min"),
    pytest.param(QuantizationSpec(kind="int4", group_size=128), id="int4-g128"),
]


def _float32_scales(weight):
    return StreamedQuantizedWeight.wrap(weight).weight


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("rows", [1, 8])
def test_matches_dequantised_product(spec, rows):
    rng = np.random.default_rng(rows)
    weight = _float32_scales(quantize_kernel(rng.normal(size=(256, 384)), spec))
    x = jnp.asarray(rng.normal(size=(rows, 256)), jnp.float32)
    out = streamed_matmul_quantized_tpu(x, weight, interpret=pltpu.InterpretParams())
    expected = x @ weight.dequantize()
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-5, atol=1e-4)


def test_streamed_weight_pads_columns_and_falls_back_for_many_rows():
    """200 columns are padded to 256 for the kernel and cut from the output; 600 rows (prefill)
    take XLA's dot on the dequantised weight; both equal the reference."""
    rng = np.random.default_rng(0)
    weight = quantize_kernel(
        rng.normal(size=(64, 200)), QuantizationSpec(kind="int8", group_size=32)
    )
    streamed = StreamedQuantizedWeight.wrap(weight, interpret=True)
    assert streamed.weight.values.shape == (64, 256) and streamed.shape == (64, 200)
    for rows in (4, 600):
        x = jnp.asarray(rng.normal(size=(rows, 64)), jnp.float32)
        expected = x @ weight.dequantize()
        np.testing.assert_allclose(np.asarray(streamed.matmul(x)), np.asarray(expected), atol=1e-4)


def test_rejects_bad_inputs():
    rng = np.random.default_rng(0)
    weight = quantize_kernel(
        rng.normal(size=(64, 128)), QuantizationSpec(kind="int8", group_size=32)
    )
    x = jnp.zeros((2, 64), jnp.float32)
    with pytest.raises(ValueError, match="weight.scales must be float32 or bfloat16"):
        streamed_matmul_quantized_tpu(x, weight)  # float16 scales, as loaded
    with pytest.raises(ValueError, match=r"x must be \[M, 64\]"):
        streamed_matmul_quantized_tpu(jnp.zeros((2, 32)), _float32_scales(weight))
    fp8 = quantize_kernel(rng.normal(size=(64, 128)), QuantizationSpec(kind="fp8"))
    with pytest.raises(ValueError, match="weight.kind must be 'int8' or 'int4'"):
        streamed_matmul_quantized_tpu(x, fp8)


@needs_libtpu
@pytest.mark.tpu_compile
def test_quantised_weights_shrink_the_counted_bytes_for_v5e_4():
    """Two layers of Llama-3-8B on v5e-4 at batch 64: the step streams int8 codes + float32
    scales (1.125 bytes per weight against bf16's 2), so the weights per chip shrink to ~0.56x.
    The step's counted bytes besides the KV shrink less (0.75x here, 0.64x for 32 layers): XLA
    counts more for the quantised untied embedding's column lookup than for the float row
    lookup."""
    from jaxgen.ahead_of_time import compile_decode_step

    config = ModelConfig.from_hf_dict(dict(LLAMA3_8B, num_hidden_layers=2))
    results = {
        kind: compile_decode_step(
            config, "v5e-4", max_model_len=512, max_num_seqs=64, quantization=kind
        )
        for kind in ("none", "int8")
    }
    assert "streamed_matmul_int8" in results["int8"]["kernels"]
    weights = {kind: r["per_chip_bytes"]["weights"] for kind, r in results.items()}
    assert 0.5 < weights["int8"] / weights["none"] < 0.6
    accessed = {kind: r["decode_step"]["bytes_accessed"] for kind, r in results.items()}
    kv = results["none"]["decode_step"]["live_kv_bytes"]
    assert (accessed["int8"] - kv) / (accessed["none"] - kv) < 0.8  # 0.75 at this commit
    # No copy of the weights: the compiler's temporaries stay small.
    assert (
        results["int8"]["per_chip_bytes"]["temp"] < 0.02 * results["int8"]["per_chip_bytes"]["hbm"]
    )


@needs_libtpu
@pytest.mark.tpu_compile
@pytest.mark.slow
def test_int8_kv_pool_shrinks_the_counted_kv_bytes_for_v5e_4():
    """Two layers of Llama-3-8B on v5e-4 (2 KV heads per chip) at batch 64 x 2048, int8
    weights: an int8 pool (codes + lane-major float32 scales, pages of 128) makes the live KV
    0.5625x of bf16's, the step's counted bytes fall by that much, and nothing else grows by
    more than the update kernel's quantising of the new rows (1.6% at this commit)."""
    from jaxgen.ahead_of_time import compile_decode_step

    config = ModelConfig.from_hf_dict(dict(LLAMA3_8B, num_hidden_layers=2))
    steps = {
        kv: compile_decode_step(
            config,
            "v5e-4",
            max_model_len=2048,
            max_num_seqs=64,
            quantization="int8",
            kv_cache_dtype=kv,
            page_size=128,
        )
        for kv in ("auto", "int8")
    }
    live = {kv: r["decode_step"]["live_kv_bytes"] for kv, r in steps.items()}
    accessed = {kv: r["decode_step"]["bytes_accessed"] for kv, r in steps.items()}
    assert live["int8"] / live["auto"] == pytest.approx(0.5625)
    assert accessed["int8"] - live["int8"] < 1.03 * (accessed["auto"] - live["auto"])
    assert steps["int8"]["per_chip_bytes"]["temp"] < 2**20  # neither pool array is copied
    assert "ragged_paged_attention_quantized" in steps["int8"]["kernels"]
