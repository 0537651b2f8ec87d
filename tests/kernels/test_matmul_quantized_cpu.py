"""The native int8 / int4 matmul (``PackedQuantizedWeight``) against the pure-jnp reference
``x @ QuantizedWeight.dequantize()`` in float64: every kind and group size, one row (registers)
and many (the shared dequantised slice), ragged rows and columns, live-row spans, groups of
weights in one call, weights in shared buffers, the RMSNorm prologue (a ``NormedInput``), int8
activations (W8A8, W4A8: the VNNI path and the XLA fallback, against ``QuantizedWeight.matmul``), and
the "cpu" backend packing a quantised model's kernels."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxgen.backends.cpu import pack_linear_weights
from jaxgen.backends.cpu_kernels import (
    PackedQuantizedWeight,
    can_pack_quantized,
    matmul_quantized_cpu_group,
    pack_shared,
    quantized_matmul_available,
    shared_panels,
    w8a8_kernel_available,
)
from jaxgen.backends.cpu_kernels import matmul_quantized as matmul_quantized_module
from jaxgen.engine.step.flat_params import FlatParams
from jaxgen.layers.linear import Linear, NormedInput, apply_linears, rms_norm
from jaxgen.quantization import QuantizationSpec, QuantizedWeight, quantize_kernel
from jaxgen.quantization.quantized_weight import fake_quantize_activations

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "cpu" or not quantized_matmul_available(),
    reason="needs the CPU backend, a C++ compiler and AVX2 + FMA + F16C",
)

SPECS = {
    "int8-channel": QuantizationSpec(kind="int8"),
    "int8-g32": QuantizationSpec(kind="int8", group_size=32),
    "int4-g32": QuantizationSpec(kind="int4", group_size=32),
    "int4-g32-min": QuantizationSpec(kind="int4", group_size=32, asymmetric=True),
    "int4-g128-min": QuantizationSpec(kind="int4", group_size=128, asymmetric=True),
    "int4-g8-min": QuantizationSpec(kind="int4", group_size=8, asymmetric=True),
}


def _live_rows_and_mask(live, rows: int):
    """``live`` spans as the kernel's ``live_rows`` (None: every row) and the [rows, 1] mask of
    the rows they cover."""
    if live is None:
        return None, np.ones((rows, 1))
    mask = np.zeros((rows, 1))
    for begin, end in live:
        mask[begin:end] = 1
    return jnp.asarray(live, jnp.int32), mask


def _reference(x, weight: QuantizedWeight, mask=None):
    out = np.asarray(x, np.float64) @ np.asarray(weight.dequantize(), np.float64)
    return out if mask is None else out * mask


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
@pytest.mark.parametrize(
    "rows, depth, columns",
    [
        (1, 640, 192),  # single-stream decode: registers only; a partial k-block
        (4, 256, 40),  # one full tile, a padded panel
        (67, 1536, 576),  # a shared slice, ragged rows, depth over several 256-deep blocks
        (300, 128, 1100),  # several row blocks, the 8-panel column blocks
    ],
)
def test_matches_dequantized_dot(spec, rows, depth, columns):
    rng = np.random.default_rng(rows + columns)
    weight = quantize_kernel(rng.standard_normal((depth, columns)), spec)
    x = jnp.asarray(rng.standard_normal((rows, depth)), jnp.float32)
    actual = jax.jit(lambda x, w: w.matmul(x))(x, PackedQuantizedWeight.pack(weight))
    np.testing.assert_allclose(
        np.asarray(actual), _reference(x, weight), rtol=1e-5, atol=2e-6 * depth
    )


def test_one_int8_row_with_odd_depth():
    """One row of per-channel int8 whose depth is not a multiple of the tile's 4-k unroll."""
    rng = np.random.default_rng(3)
    weight = quantize_kernel(rng.standard_normal((250, 40)), SPECS["int8-channel"])
    x = jnp.asarray(rng.standard_normal((1, 250)), jnp.float32)
    actual = jax.jit(lambda x, w: w.matmul(x))(x, PackedQuantizedWeight.pack(weight))
    np.testing.assert_allclose(np.asarray(actual), _reference(x, weight), rtol=1e-5, atol=5e-4)


def _cpu_flag(name: str) -> bool:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return any(
                line.startswith("flags") and name in line.split(":", 1)[1].split()
                for line in cpuinfo
            )
    except OSError:
        return False


@pytest.mark.parametrize("spec", ["int8-channel", "int8-g32"])
def test_int8_row_tiles(spec):
    """2-8 rows of int8 codes with float x (a verify step's draft rows on a Q8_0 LM head) take
    tiles of up to 5 rows (4 without AVX-512) that scale once per group: every tile height and a ragged last one,
    per-channel over an odd depth (a k left after the tile's 4-k steps) and in groups of 32;
    with AVX-512 each row's product is its one-row product bit for bit."""
    depth = 250 if spec == "int8-channel" else 320
    rng = np.random.default_rng(29)
    weight = quantize_kernel(rng.standard_normal((depth, 40)), SPECS[spec])
    packed = PackedQuantizedWeight.pack(weight)
    run = jax.jit(lambda x, w: w.matmul(x))
    x = jnp.asarray(rng.standard_normal((8, depth)), jnp.float32)
    one_row = np.concatenate([np.asarray(run(x[i : i + 1], packed)) for i in range(8)])
    for rows in range(2, 9):
        actual = np.asarray(run(x[:rows], packed))
        np.testing.assert_allclose(
            actual, _reference(x[:rows], weight), rtol=1e-5, atol=2e-6 * depth
        )
        if _cpu_flag("avx512f"):
            np.testing.assert_array_equal(actual, one_row[:rows])


def test_int4_row_tiles_give_each_row_the_one_row_result():
    """1-8 rows of int4 codes (decode's row, a verify step's draft rows) take tiles of up to 5
    rows over one conversion of the codes: every tile height and split (7 rows: 4 + 3), over two
    k-blocks' depth; each row's product equals that row's own one-row product bit for bit (with
    AVX-512; within rounding on the portable and AVX2 paths), so a verify step scores a token as
    the decode step would."""
    rng = np.random.default_rng(31)
    weight = quantize_kernel(rng.standard_normal((320, 48)), SPECS["int4-g32-min"])
    packed = PackedQuantizedWeight.pack(weight)
    run = jax.jit(lambda x, w: w.matmul(x))
    x = jnp.asarray(rng.standard_normal((8, 320)), jnp.float32)
    one_row = np.concatenate([np.asarray(run(x[i : i + 1], packed)) for i in range(8)])
    wide = _cpu_flag("avx512f")  # -march=native builds the 512-bit tiles
    for rows in range(1, 9):
        actual = np.asarray(run(x[:rows], packed))
        np.testing.assert_allclose(actual, _reference(x[:rows], weight), rtol=1e-5, atol=2e-6 * 320)
        if wide:
            np.testing.assert_array_equal(actual, one_row[:rows])


@pytest.mark.parametrize("spec", ["int8-channel", "int4-g32-min"])
def test_every_slice_tile_height(spec):
    """5-17 rows take the shared dequantised slice (from 9 rows where 4-row tiles take fewer:
    int8, and int4 with AVX-512): full tiles and every ragged last tile (1-8 rows with AVX-512,
    1-6 without), over two k-blocks (256 + 64 deep)."""
    rng = np.random.default_rng(17)
    weight = quantize_kernel(rng.standard_normal((320, 48)), SPECS[spec])
    packed = PackedQuantizedWeight.pack(weight)
    run = jax.jit(lambda x, w: w.matmul(x))
    for rows in range(5, 18):
        x = jnp.asarray(rng.standard_normal((rows, 320)), jnp.float32)
        np.testing.assert_allclose(
            np.asarray(run(x, packed)), _reference(x, weight), rtol=1e-5, atol=2e-6 * 320
        )


@pytest.mark.parametrize("spans", [[[0, 9], [12, 45]], [[0, 1], [0, 0]], [[0, 2], [20, 22]]])
def test_group_and_live_rows(spans):
    """q/k/v-like widths in one call; many live rows (balanced column blocks), one row and four
    rows in two spans (one stretch of the group's panels per thread, crossing weights)."""
    rows, depth = 50, 320
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.standard_normal((rows, depth)), jnp.float32)
    weights = [
        quantize_kernel(rng.standard_normal((depth, n)), SPECS["int4-g32-min"])
        for n in (576, 192, 100)
    ]
    live = np.array(spans, np.int32)
    packed = [PackedQuantizedWeight.pack(w) for w in weights]
    run = jax.jit(lambda x, ws, live: matmul_quantized_cpu_group(x, ws, live_rows=live))
    mask = np.zeros((rows, 1))
    for begin, end in spans:
        mask[begin:end] = 1
    for weight, actual in zip(weights, run(x, packed, live), strict=True):
        np.testing.assert_allclose(actual, _reference(x, weight, mask), rtol=1e-5, atol=1e-3)
    assert run.lower(x, packed, live).as_text().count("jaxgen_matmul_quantized") == 1
    with pytest.raises(ValueError, match="same bits"):
        matmul_quantized_cpu_group(x, [])
    with pytest.raises(ValueError, match="depth"):
        matmul_quantized_cpu_group(x[:, :64], packed[:1])
    with pytest.raises(ValueError, match="live_rows"):
        matmul_quantized_cpu_group(x, packed[:1], live_rows=live[:1])


@pytest.mark.parametrize("spec", ["int8-channel", "int4-g32-min"])
@pytest.mark.parametrize("rows, live", [(1, None), (2, [[0, 1], [0, 0]]), (70, [[3, 9], [20, 70]])])
def test_norm_prologue_matches_the_normed_rows(spec, rows, live):
    """A ``NormedInput``: the kernel norms the live rows itself, and the products equal the
    reference on ``rms_norm``'s rows (float64 dot) and the same kernel on them in float32; padding
    rows stay zero, and one native call holds the norm (no XLA norm before it)."""
    depth = 576
    rng = np.random.default_rng(rows)
    # Rows of very different scales: the norm, not x's magnitude, sets the products.
    x = rng.standard_normal((rows, depth)) * rng.uniform(0.01, 50, (rows, 1))
    x = jnp.asarray(x, jnp.float32)
    norm_weight = jnp.asarray(rng.uniform(0.5, 1.5, depth), jnp.float32)
    weights = [quantize_kernel(rng.standard_normal((depth, n)), SPECS[spec]) for n in (576, 192)]
    packed = [PackedQuantizedWeight.pack(w) for w in weights]
    live_rows, mask = _live_rows_and_mask(live, rows)

    def normed(x, w, ws, live_rows):
        return matmul_quantized_cpu_group(NormedInput(x, w, 1e-5), ws, live_rows=live_rows)

    def pre_normed(x, w, ws, live_rows):
        return matmul_quantized_cpu_group(rms_norm(x, w, 1e-5), ws, live_rows=live_rows)

    actual = jax.jit(normed)(x, norm_weight, packed, live_rows)
    expected = jax.jit(pre_normed)(x, norm_weight, packed, live_rows)
    rows_normed = rms_norm(x, norm_weight, 1e-5)
    for weight, out, same_kernel in zip(weights, actual, expected, strict=True):
        np.testing.assert_allclose(
            out, _reference(rows_normed, weight, mask), rtol=1e-5, atol=2e-6 * depth
        )
        np.testing.assert_allclose(out, same_kernel, rtol=1e-5, atol=1e-4)
    hlo = jax.jit(normed).lower(x, norm_weight, packed, live_rows).as_text()
    assert hlo.count("jaxgen_matmul_quantized") == 1
    assert "rsqrt" not in hlo


def test_norm_prologue_falls_back_to_xla_for_other_weights():
    """A norm weight that is not float32 of x's width is computed in XLA before the kernel."""
    rng = np.random.default_rng(9)
    x = jnp.asarray(rng.standard_normal((3, 64)), jnp.float32)
    weight = quantize_kernel(rng.standard_normal((64, 32)), SPECS["int8-channel"])
    packed = PackedQuantizedWeight.pack(weight)
    norm_weight = jnp.asarray(rng.uniform(0.5, 1.5, 64), jnp.bfloat16)
    run = jax.jit(lambda x, w, p: p.matmul(NormedInput(x, w, 1e-6)))
    np.testing.assert_allclose(
        run(x, norm_weight, packed),
        _reference(rms_norm(x, norm_weight, 1e-6), weight),
        rtol=1e-5,
        atol=1e-4,
    )
    assert "rsqrt" in run.lower(x, norm_weight, packed).as_text()


W8A8 = QuantizationSpec(kind="int8", group_size=32, activations="int8")
INTEGER_ACTIVATIONS = {  # W4A8: a GGUF's Q4_1 / Q4_0 under quantization="w4a8"
    "w8a8": W8A8,
    "w8a16": dataclasses.replace(W8A8, activations="int16"),
    "w4a8-min": QuantizationSpec(kind="int4", group_size=32, asymmetric=True, activations="int8"),
    "w4a8": QuantizationSpec(kind="int4", group_size=32, activations="int8"),
}


@pytest.mark.parametrize("spec", INTEGER_ACTIVATIONS.values(), ids=INTEGER_ACTIVATIONS.keys())
@pytest.mark.parametrize("vnni", [True, False], ids=["vnni", "xla-fallback"])
@pytest.mark.parametrize(
    "rows, depth, live",
    [(1, 576, None), (5, 576, None), (67, 1536, [[0, 9], [20, 67]]), (16, 64, [[2, 3], [0, 0]])],
)
def test_integer_activations_match_the_reference(monkeypatch, spec, vnni, rows, depth, live):
    """int8 / int16 activations (int8 weights; int4 ones take int8): x's live rows quantised
    per row and 32 columns, integer products, for q/k/v-like groups in one call, with and
    without the norm prologue. int8: equal to ``QuantizedWeight.matmul`` (fake-quantised x) up
    to float rounding; int16: to the float x's product within its 16-bit rounding (the
    reference takes x as it is)."""
    if vnni and not w8a8_kernel_available():
        pytest.skip("this CPU has no AVX-512 VNNI + VBMI")
    if not vnni:
        monkeypatch.setattr(matmul_quantized_module, "w8a8_kernel_available", lambda: False)
    rng = np.random.default_rng(rows * depth)
    x = jnp.asarray(
        rng.standard_normal((rows, depth)) * rng.uniform(0.1, 10, (rows, 1)), jnp.float32
    )
    activations = spec.activations
    weights = [quantize_kernel(rng.standard_normal((depth, n)), spec) for n in (576, 192, 40)]
    packed = [PackedQuantizedWeight.pack(w) for w in weights]
    assert {p.activations for p in packed} == {activations}
    norm_weight = jnp.asarray(rng.uniform(0.5, 1.5, depth), jnp.float32)
    live_rows, mask = _live_rows_and_mask(live, rows)
    run = jax.jit(lambda x, ws, live: matmul_quantized_cpu_group(x, ws, live_rows=live))
    normed = jax.jit(
        lambda x, nw, ws, live: matmul_quantized_cpu_group(
            NormedInput(x, nw, 1e-5), ws, live_rows=live
        )
    )
    rows_normed = rms_norm(x, norm_weight, 1e-5)
    # Normed rows may differ from XLA's in the last bit, which can move a code by one step.
    for inputs, outs, tolerance in [
        (x, run(x, packed, live_rows), 1e-5 if activations == "int8" else 1e-4),
        (rows_normed, normed(x, norm_weight, packed, live_rows), 1e-3),
    ]:
        for weight, out in zip(weights, outs, strict=True):
            expected = np.asarray(weight.matmul(inputs)) * mask
            scale = np.abs(expected).max()
            np.testing.assert_allclose(out, expected, rtol=1e-5, atol=tolerance * scale)
    if vnni and activations == "int16":  # the kernel's own 16-bit codes, to float rounding
        codes_x = fake_quantize_activations(x, bits=16)
        for weight, out in zip(weights, run(x, packed, live_rows), strict=True):
            expected = np.asarray(codes_x @ weight.dequantize()) * mask
            scale = np.abs(expected).max()
            np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5 * scale)
    hlo = run.lower(x, packed, live_rows).as_text()
    assert hlo.count("jaxgen_matmul_quantized") == 1
    # int8 codes: in the kernel, or in XLA before it; int16 codes only in the kernel.
    assert ("round" in hlo) == (not vnni and activations == "int8")


def test_w8a8_and_weight_only_int8_are_separate_calls():
    """A group mixing int8 activations with float ones runs one call per kind."""
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.standard_normal((3, 64)), jnp.float32)
    mixed = [
        quantize_kernel(rng.standard_normal((64, 32)), W8A8),
        quantize_kernel(rng.standard_normal((64, 32)), SPECS["int8-g32"]),
    ]
    packed = [PackedQuantizedWeight.pack(w) for w in mixed]
    outs = PackedQuantizedWeight.matmul_group(x, packed)
    for weight, out in zip(mixed, outs, strict=True):
        np.testing.assert_allclose(out, weight.matmul(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="same bits and activations"):
        matmul_quantized_cpu_group(x, packed)


def test_int4_groups_that_split_a_lane_keep_xlas_path():
    """int4 panels hold 8 rows per 32-bit lane: groups of 2, 4 or 6 rows stay unpacked."""
    rng = np.random.default_rng(3)
    spec = QuantizationSpec(kind="int4", group_size=4, asymmetric=True)
    weight = quantize_kernel(rng.standard_normal((64, 32)), spec)
    assert not can_pack_quantized(weight)
    with pytest.raises(ValueError, match="groups of 4"):
        PackedQuantizedWeight.pack(weight)
    assert can_pack_quantized(quantize_kernel(rng.standard_normal((64, 32)), SPECS["int4-g8-min"]))


def test_fp8_and_float32_scales_are_refused():
    w = np.random.default_rng(0).standard_normal((64, 32))
    with pytest.raises(ValueError, match="fp8 with float32 scales"):
        PackedQuantizedWeight.pack(quantize_kernel(w, QuantizationSpec(kind="fp8")))


def test_backend_packs_quantized_linear_kernels():
    layers = (
        Linear(64, 48, bias=True, dtype=jnp.float32, rngs=nnx.Rngs(0)),
        Linear(64, 40, bias=False, dtype=jnp.float32, rngs=nnx.Rngs(1)),
    )
    x = jnp.asarray(np.random.default_rng(2).standard_normal((7, 64)), jnp.float32)
    for layer in layers:
        kernel = layer.kernel.get_value()
        layer.kernel.set_value(quantize_kernel(kernel, SPECS["int4-g32-min"]))
    expected = apply_linears(layers, x)  # XLA: x @ dequantize()
    graphdef, params = nnx.split(layers)
    packed = pack_linear_weights(params)[0]
    assert isinstance(packed[0]["kernel"].get_value(), PackedQuantizedWeight)

    def run(state, x):
        return apply_linears(nnx.merge(graphdef, state), x)

    for actual, reference in zip(jax.jit(run)(packed, x), expected, strict=True):
        np.testing.assert_allclose(actual, reference, rtol=1e-5, atol=1e-5)
    assert jax.jit(run).lower(packed, x).as_text().count("jaxgen_matmul_quantized") == 1
    assert packed[0]["kernel"].get_value().values is packed[1]["kernel"].get_value().values


def test_shared_buffers_compute_the_same_products(monkeypatch):
    """Weights of both kinds packed into shared buffers (at offsets) give their own arrays'
    products exactly; a step passes each shared buffer once; offsets past a buffer are refused."""
    rng = np.random.default_rng(11)
    depth, rows = 256, 3
    x = jnp.asarray(rng.standard_normal((rows, depth)), jnp.float32)
    specs = ["int4-g32-min", "int8-g32", "int4-g32", "int8-channel", "int4-g128-min"]
    weights = [
        quantize_kernel(rng.standard_normal((depth, n)), SPECS[s])
        for s, n in zip(specs, (96, 40, 130, 64, 16), strict=True)
    ]
    own = [PackedQuantizedWeight.pack(w) for w in weights]
    shared = pack_shared(weights)
    assert [w.offsets[0] for w in shared] == [0, 0, 96 * depth // 2, 48 * depth, 240 * depth // 2]
    assert len({id(w.values) for w in shared}) == 2  # int8 codes, uint8 int4 lanes
    run = jax.jit(lambda x, ws: [w.matmul(x) for w in ws])
    for alone, in_shared in zip(run(x, own), run(x, shared), strict=True):
        np.testing.assert_array_equal(np.asarray(alone), np.asarray(in_shared))
    int4 = [shared[0], shared[2]]
    grouped = jax.jit(lambda x, ws: matmul_quantized_cpu_group(x, ws))(x, int4)
    for actual, expected in zip(grouped, run(x, int4), strict=True):
        np.testing.assert_array_equal(np.asarray(actual), np.asarray(expected))
    arrays, flat = FlatParams.flatten(shared, None)
    assert len(arrays) == 4  # int8 codes, int4 lanes, scales, mins
    assert len(jax.tree_util.tree_leaves(shared)) == 13
    rebuilt, head = flat.unflatten(arrays)
    assert head is None and all(
        a.offsets == b.offsets for a, b in zip(rebuilt, shared, strict=True)
    )
    # Buffers of at most 20,000 elements: the codes spread over several, each weight in one.
    monkeypatch.setattr(shared_panels, "SHARED_BUFFER_ELEMENTS", 20_000)
    split = pack_shared(weights)
    assert len(FlatParams.flatten(split, None)[0]) > 4
    for alone, in_split in zip(run(x, own), run(x, split), strict=True):
        np.testing.assert_array_equal(np.asarray(alone), np.asarray(in_split))
    past_the_end = dataclasses.replace(shared[4], offsets=(shared[4].offsets[0] + 64, 0, 0, 0, 0))
    with pytest.raises(Exception, match="packed weight shapes"):
        jax.block_until_ready(past_the_end.matmul(x))
