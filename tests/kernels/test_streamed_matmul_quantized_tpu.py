"""The quantised streamed matmul (int8 / int4 codes and scales streamed from HBM, dequantised in
VMEM) against ``x @ dequantize()`` in TPU interpret mode, its input checks, and the pallas-tpu
decode step with quantised weights compiled for v5e: the counted bytes shrink with the codes."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from jaxgen.backends.streamed_quantized_weight import StreamedQuantizedWeight
from jaxgen.config import ModelConfig
from jaxgen.quantization.quantize import QuantizationSpec, quantize_kernel
from pallas_kernels.tpu.streamed_matmul import (
    float16_bits_to_float32,
    pack_float16_pairs,
    rms_norm_reference,
    streamed_gated_matmul_quantized_tpu,
    streamed_gated_matmul_reference,
    streamed_matmul_quantized_tpu,
)
from tests.backends.test_pallas_tpu_backend import LLAMA3_8B, needs_libtpu

SPECS = [
    pytest.param(QuantizationSpec(kind="int8", group_size=32), id="int8-g32"),
    pytest.param(QuantizationSpec(kind="int4", group_size=32, asymmetric=True), id="int4-g32-min"),
    pytest.param(QuantizationSpec(kind="int4", group_size=128), id="int4-g128"),
]


def _float32_scales(weight):
    """``weight`` with its float16 scales (and mins) in float32, exactly."""
    mins = None if weight.mins is None else weight.mins.astype(jnp.float32)
    return dataclasses.replace(weight, scales=weight.scales.astype(jnp.float32), mins=mins)


def _packed_scales(weight):
    """``weight`` with its float16 scales (and mins) packed in pairs, as the backend holds it."""
    mins = None if weight.mins is None else pack_float16_pairs(weight.mins)
    return dataclasses.replace(weight, scales=pack_float16_pairs(weight.scales), mins=mins)


def _with_extreme_scales(weight):
    """A subnormal float16 scale and, with mins, negative and subnormal mins."""
    scales = np.asarray(weight.scales).copy()
    scales[0, 0] = np.float16(2.0**-20)  # subnormal
    scales[-1, 3] = np.float16(-(2.0**-24))  # the smallest, negated
    mins = None
    if weight.mins is not None:
        mins = -np.abs(np.asarray(weight.mins))
        mins[1, 2] = np.float16(-3 * 2.0**-24)
    return dataclasses.replace(
        weight, scales=jnp.asarray(scales), mins=None if mins is None else jnp.asarray(mins)
    )


def test_float16_bits_to_float32_is_exact_for_every_finite_float16():
    bits = np.arange(2**16, dtype=np.uint16)
    finite = np.isfinite(bits.view(np.float16))
    got = np.asarray(float16_bits_to_float32(jnp.asarray(bits.astype(np.int32))))
    expected = bits.view(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got[finite].view(np.uint32), expected[finite].view(np.uint32))


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("rows", [1, 8])
def test_matches_dequantised_product(spec, rows):
    """Float32 scales and float16 scales packed in pairs (with a subnormal scale, negative
    mins) give the same bits, and both equal ``x @ dequantize()``."""
    rng = np.random.default_rng(rows)
    weight = _with_extreme_scales(quantize_kernel(rng.normal(size=(256, 384)), spec))
    x = jnp.asarray(rng.normal(size=(rows, 256)), jnp.float32)
    interpret = pltpu.InterpretParams()
    out = streamed_matmul_quantized_tpu(x, _float32_scales(weight), interpret=interpret)
    packed = streamed_matmul_quantized_tpu(x, _packed_scales(weight), interpret=interpret)
    np.testing.assert_array_equal(np.asarray(packed), np.asarray(out))
    expected = x @ weight.dequantize()
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-5, atol=1e-4)


def test_dequantised_block_is_bit_exact_with_float32_scales():
    """The dequantised weight itself (x = identity rows) is the float32 reference's, bit for
    bit, through the packed float16 scales."""
    rng = np.random.default_rng(3)
    spec = QuantizationSpec(kind="int4", group_size=32, asymmetric=True)
    weight = _with_extreme_scales(quantize_kernel(rng.normal(size=(64, 128)), spec))
    x = jnp.eye(8, 64, dtype=jnp.float32)
    out = streamed_matmul_quantized_tpu(
        x, _packed_scales(weight), interpret=pltpu.InterpretParams()
    )
    np.testing.assert_array_equal(np.asarray(out), np.asarray(weight.dequantize())[:8])


def test_streamed_weight_packs_float16_scales_and_falls_back_for_odd_groups():
    """Even groups: the scales stay 16-bit (int32 words of two), the product as the reference;
    three groups: float32 scales."""
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(4, 96)), jnp.float32)
    for depth, packed in ((64, True), (96, False)):
        weight = quantize_kernel(
            rng.normal(size=(depth, 128)),
            QuantizationSpec(kind="int4", group_size=32, asymmetric=True),
        )
        streamed = StreamedQuantizedWeight.wrap(weight, interpret=True)
        scales = streamed.weight.scales
        assert (scales.dtype, scales.shape[0]) == ((jnp.int32, 1) if packed else (jnp.float32, 3))
        assert streamed.weight.mins.dtype == scales.dtype
        rows = x[:, :depth]
        np.testing.assert_allclose(
            np.asarray(streamed.matmul(rows)), np.asarray(rows @ weight.dequantize()), atol=1e-4
        )


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


def test_packed_scales_under_a_depth_split():
    """Split over depth on 2 chips, each chip's words pair its own groups (4 of 8 each), so
    the kernel under shard_map and XLA's path both give ``x @ dequantize()``."""
    from tests.sharded_worker import run_worker

    result = run_worker("packed_scales_depth_split", {}, num_devices=2)
    assert result["split"] == "depth" and result["packed_pieces"] == 2
    assert result["scales"] == ["int32", 4, 128]
    assert result["kernel_error"] < 1e-4 and result["xla_error"] < 1e-4


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
    with pytest.raises(ValueError, match=r"weight.scales must be \(1, 128\)"):
        bad = dataclasses.replace(weight, scales=jnp.zeros((2, 128), jnp.int32))
        streamed_matmul_quantized_tpu(x, bad)
    int4 = quantize_kernel(
        rng.normal(size=(64, 128)), QuantizationSpec(kind="int4", group_size=32, asymmetric=True)
    )
    with pytest.raises(ValueError, match="weight.mins must be float32 or bfloat16, or int32"):
        bad = dataclasses.replace(_packed_scales(int4), mins=int4.mins.astype(jnp.float32))
        streamed_matmul_quantized_tpu(x, bad)
    odd = quantize_kernel(rng.normal(size=(96, 128)), QuantizationSpec(kind="int8", group_size=32))
    with pytest.raises(ValueError, match="weight.scales: packed float16 pairs need an even"):
        bad = dataclasses.replace(odd, scales=jnp.zeros((1, 128), jnp.int32))
        streamed_matmul_quantized_tpu(jnp.zeros((2, 96)), bad)
    fp8 = quantize_kernel(rng.normal(size=(64, 128)), QuantizationSpec(kind="fp8"))
    with pytest.raises(ValueError, match="weight.kind must be 'int8' or 'int4'"):
        streamed_matmul_quantized_tpu(x, fp8)


@needs_libtpu
@pytest.mark.tpu_compile
@pytest.mark.slow
def test_quantised_weights_shrink_the_counted_bytes_for_v5e_4():
    """Two layers of Llama-3-8B on v5e-4 at batch 64: the step streams int8 codes + float16
    scales packed in pairs (1.0625 bytes per weight against bf16's 2), so the weights per chip
    shrink to 0.53x. The step's counted bytes besides the KV shrink less (0.72x here): the
    activations, norms, sampling and the quantised embedding's lookup count alike or more."""
    from jaxgen.planning.ahead_of_time import compile_decode_step

    config = ModelConfig.from_hf_dict(dict(LLAMA3_8B, num_hidden_layers=2))
    results = {
        kind: compile_decode_step(
            config, "v5e-4", max_model_len=512, max_num_seqs=64, quantization=kind
        )
        for kind in ("none", "int8")
    }
    assert "streamed_matmul_int8" in results["int8"]["kernels"]
    # No cross-program prefetch: the int8 embedding's 8 MB scale table is not copied to VMEM
    # for a step's 64 rows of it (PallasTPUBackend.compiler_options).
    assert results["int8"]["decode_step"]["vmem_prefetch_bytes"] < 2**20
    weights = {kind: r["per_chip_bytes"]["weights"] for kind, r in results.items()}
    assert 0.5 < weights["int8"] / weights["none"] < 0.54  # 0.532 at this commit
    accessed = {kind: r["decode_step"]["bytes_accessed"] for kind, r in results.items()}
    kv = results["none"]["decode_step"]["live_kv_bytes"]
    assert (accessed["int8"] - kv) / (accessed["none"] - kv) < 0.74  # 0.723 at this commit
    # No copy of the weights: the compiler's temporaries stay small.
    assert (
        results["int8"]["per_chip_bytes"]["temp"] < 0.02 * results["int8"]["per_chip_bytes"]["hbm"]
    )


@needs_libtpu
@pytest.mark.tpu_compile
@pytest.mark.slow
def test_int8_kv_pool_shrinks_the_counted_kv_bytes_for_v5e_4():
    """Two layers of Llama-3-8B on v5e-4 (2 KV heads per chip) at batch 64 x 2048, int8
    weights: an int8 pool (codes + lane-major bfloat16 scales, pages of 128) makes the live KV
    0.5078x of bf16's (one byte per code and two per head of 128 codes), the step's counted
    bytes fall by that much, and nothing else grows by more than the update kernel's quantising
    of the new rows."""
    from jaxgen.planning.ahead_of_time import compile_decode_step

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
    assert live["int8"] / live["auto"] == pytest.approx(0.5078125)
    assert accessed["int8"] - live["int8"] < 1.03 * (accessed["auto"] - live["auto"])
    assert steps["int8"]["per_chip_bytes"]["temp"] < 2**20  # neither pool array is copied
    assert "ragged_paged_attention_quantized" in steps["int8"]["kernels"]


@needs_libtpu
@pytest.mark.tpu_compile
@pytest.mark.slow
def test_int8_weights_and_kv_counted_bytes_against_bf16_for_v5e_4():
    """Llama-3-8B (32 layers) on v5e-4 at batch 64 x 2048: int8 weights (16-bit scales) and
    an int8 pool (one bfloat16 scale per token and head) make the step's counted bytes at most
    0.55x of bf16's, the issue's target (0.5455x at this commit), the floor 0.519x."""
    from jaxgen.planning.ahead_of_time import compile_decode_step

    config = ModelConfig.from_hf_dict(LLAMA3_8B)
    steps = {
        (weights, kv): compile_decode_step(
            config,
            "v5e-4",
            max_model_len=2048,
            max_num_seqs=64,
            quantization=weights,
            kv_cache_dtype=kv,
            page_size=128,
        )["decode_step"]
        for weights, kv in (("none", "auto"), ("int8", "int8"))
    }
    bf16, int8 = steps[("none", "auto")], steps[("int8", "int8")]
    assert int8["bytes_accessed"] / bf16["bytes_accessed"] <= 0.55
    assert int8["floor_bytes"] / bf16["floor_bytes"] < 0.52


@pytest.mark.parametrize("spec", SPECS)
def test_gated_matches_dequantised_products(spec):
    """``act(x @ dequant(gate)) * (x @ dequant(up))`` in one call, float16 scales packed in
    pairs as the backend holds them; and the backend's ``matmul_gated`` on the same weights."""
    from jaxgen.backends.streamed_quantized_weight import StreamedQuantizedWeight

    rng = np.random.default_rng(5)
    gate, up = (quantize_kernel(rng.normal(size=(256, 384)), spec) for _ in range(2))
    x = jnp.asarray(rng.normal(size=(8, 256)), jnp.float32)
    got = streamed_gated_matmul_quantized_tpu(
        x, _packed_scales(gate), _packed_scales(up), interpret=pltpu.InterpretParams()
    )
    want = streamed_gated_matmul_reference(x, gate.dequantize(), up.dequantize(), "silu")
    # int4 sums its two nibble halves apart, and the product of two sums doubles their error.
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-4, atol=1e-3)
    g, u = (StreamedQuantizedWeight.wrap(w, interpret=True) for w in (gate, up))
    fused = StreamedQuantizedWeight.matmul_gated(x, g, u, "silu")
    np.testing.assert_allclose(np.asarray(fused), np.asarray(want), rtol=2e-4, atol=1e-3)
    with pytest.raises(ValueError, match="gate and up must share kind, shape, group size"):
        streamed_gated_matmul_quantized_tpu(x, _packed_scales(gate), _float32_scales(up))


@pytest.mark.parametrize("spec", SPECS)
def test_norm_prologue_matches_dequantised_products(spec):
    """``norm=(weight, eps)`` on the quantised calls (an int4 call norms its two halves of x
    together): ``rms_norm(x) @ dequant(w)``, plain and gated; and through the backend's kernel
    protocol with a ``NormedInput``."""
    from jaxgen.layers.linear import NormedInput, gated_matmul, matmuls

    rng = np.random.default_rng(11)
    gate, up = (quantize_kernel(rng.normal(size=(256, 384)), spec) for _ in range(2))
    x = jnp.asarray(rng.normal(size=(13, 256)) * 4.0 + 0.5, jnp.float32)
    weight = jnp.asarray(rng.uniform(0.5, 1.5, 256), jnp.float32)
    normed = rms_norm_reference(x, weight, 1e-5)
    interpret = pltpu.InterpretParams()
    got = streamed_matmul_quantized_tpu(
        x, _packed_scales(gate), norm=(weight, 1e-5), interpret=interpret
    )
    want = normed @ gate.dequantize()
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-4)
    got = streamed_gated_matmul_quantized_tpu(
        x, _packed_scales(gate), _packed_scales(up), norm=(weight, 1e-5), interpret=interpret
    )
    want = streamed_gated_matmul_reference(normed, gate.dequantize(), up.dequantize(), "silu")
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-4, atol=1e-3)
    g, u = (StreamedQuantizedWeight.wrap(w, interpret=True) for w in (gate, up))
    normed_input = NormedInput(x, weight, 1e-5)
    fused = gated_matmul(normed_input, g, u, "silu")
    np.testing.assert_allclose(np.asarray(fused), np.asarray(want), rtol=2e-4, atol=1e-3)
    (plain,) = matmuls(normed_input, [g])
    np.testing.assert_allclose(
        np.asarray(plain), np.asarray(normed @ gate.dequantize()), rtol=1e-5, atol=1e-4
    )


@needs_libtpu
@pytest.mark.tpu_compile
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_aot_compile_of_the_norm_prologue_on_quantised_weights(kind):
    """Mosaic compiles the quantised calls with ``norm=`` for v5e (an int4 call norms its two
    halves of x together), plain and gated, and counts no more than the codes, scales and mins,
    x (with int4's split of it into halves), the norm's weight and out."""
    import jax
    from jax.experimental import topologies

    from jaxgen.quantization.quantized_weight import QuantizedWeight

    topology = topologies.get_topology_desc(
        platform="tpu", topology_name="v5e:1x1", chips_per_host_bounds=(1, 1, 1)
    )
    mesh = jax.sharding.Mesh(np.array(topology.devices[:1]), ("x",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def shape(dims, dtype):
        return jax.ShapeDtypeStruct(dims, dtype, sharding=sharding)

    rows, depth, columns, group = 64, 4096, 1024, 32
    int4 = kind == "int4"
    codes = shape(
        (depth // 2, columns) if int4 else (depth, columns), jnp.uint8 if int4 else jnp.int8
    )
    packed = shape((depth // group // 2, columns), jnp.int32)  # float16 pairs
    leaves = [codes, packed] + ([packed] if int4 else [])

    def weight(values, scales, *mins):
        mins = mins[0] if mins else None
        return QuantizedWeight(values, scales, mins, kind, group, (depth, columns))

    def step(x, norm_weight, *leaves):
        norm = (norm_weight, 1e-5)
        w = weight(*leaves)
        plain = streamed_matmul_quantized_tpu(x, w, norm=norm)
        return plain, streamed_gated_matmul_quantized_tpu(x, w, w, norm=norm)

    x, norm_weight = shape((rows, depth), jnp.bfloat16), shape((depth,), jnp.bfloat16)
    with jax.set_mesh(mesh):
        compiled = jax.jit(step).trace(x, norm_weight, *leaves).lower().compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    leaf_bytes = sum(np.prod(leaf.shape) * leaf.dtype.itemsize for leaf in leaves)
    activations = (rows * depth * (2 + 2 * int4) + depth + rows * columns) * 2
    assert 3 * leaf_bytes <= cost["bytes accessed"] <= 3 * leaf_bytes + 3 * activations


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K", "Q3_K", "Q2_K", "Q5_1", "IQ4_XS"])
def test_kept_gguf_layouts_stream_exactly(qtype):
    """The kept GGUF layouts (float32 scales, groups of 16, int8 codes with minimums) through
    the pallas-tpu backend's streamed kernel: its product is the file's dequantised weight's."""
    from tests.gguf_quant_blocks import kept_weight

    weight = kept_weight(qtype, 256, 128)
    streamed = StreamedQuantizedWeight.wrap(weight, interpret=True)
    assert streamed.streams(2, jnp.float32)
    x = jnp.asarray(np.random.default_rng(5).standard_normal((2, 256)), jnp.float32)
    expected = np.asarray(x, np.float64) @ np.asarray(weight.dequantize(), np.float64)
    np.testing.assert_allclose(np.asarray(streamed.matmul(x)), expected, rtol=1e-4, atol=1e-4)
