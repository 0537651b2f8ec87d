"""The native int4 x int8-activation matmul (W4A8, ``quantization="w4a8"``; the VNNI path and
the XLA fallback) against ``QuantizedWeight.matmul`` (x fake-quantised per row and 32 columns,
times the dequantised weight): symmetric and asymmetric int4 (a GGUF's Q4_0 / Q4_1), groups of
32 and 128, 1 to 8 rows in one tile and more in several, live-row spans, a q/k/v-like group in
one call, the RMSNorm prologue; and every row's result bit for bit the one it gets alone (a
verify step's rows and decoding without speculation agree)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgen.backends.cpu_kernels import (
    PackedQuantizedWeight,
    matmul_quantized_cpu_group,
    quantized_matmul_available,
    w8a8_kernel_available,
)
from jaxgen.backends.cpu_kernels import matmul_quantized as matmul_quantized_module
from jaxgen.layers.linear import NormedInput, rms_norm
from jaxgen.quantization import QuantizationSpec, quantize_kernel
from jaxgen.quantization.quantize import with_int8_activations

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "cpu" or not quantized_matmul_available(),
    reason="needs the CPU backend, a C++ compiler and AVX2 + FMA + F16C",
)

W4A8 = {
    "q4_1-g32": QuantizationSpec(kind="int4", group_size=32, asymmetric=True, activations="int8"),
    "q4_0-g32": QuantizationSpec(kind="int4", group_size=32, activations="int8"),
    "g128-min": QuantizationSpec(kind="int4", group_size=128, asymmetric=True, activations="int8"),
}


def _spans(live, rows):
    if live is None:
        return None, np.ones((rows, 1))
    mask = np.zeros((rows, 1))
    for begin, end in live:
        mask[begin:end] = 1
    return jnp.asarray(live, jnp.int32), mask


@pytest.mark.parametrize("spec", W4A8.values(), ids=W4A8.keys())
@pytest.mark.parametrize("vnni", [True, False], ids=["vnni", "xla-fallback"])
@pytest.mark.parametrize(
    "rows, depth, live",
    [
        (1, 640, None),  # decode's row
        (5, 1536, None),  # a verify step's rows: one tile
        (8, 640, [[0, 3], [4, 8]]),  # a full tile with a dead row
        (67, 1536, [[0, 9], [20, 67]]),  # prefill: several tiles and row blocks
    ],
)
def test_matches_the_fake_quantised_reference(monkeypatch, spec, vnni, rows, depth, live):
    if vnni and not w8a8_kernel_available():
        pytest.skip("this CPU has no AVX-512 VNNI + VBMI")
    if not vnni:
        monkeypatch.setattr(matmul_quantized_module, "w8a8_kernel_available", lambda: False)
    rng = np.random.default_rng(rows * depth)
    x = jnp.asarray(
        rng.standard_normal((rows, depth)) * rng.uniform(0.1, 10, (rows, 1)), jnp.float32
    )
    weights = [quantize_kernel(rng.standard_normal((depth, n)), spec) for n in (576, 192, 40)]
    packed = [PackedQuantizedWeight.pack(w) for w in weights]
    assert {(p.bits, p.activations) for p in packed} == {(4, "int8")}
    norm_weight = jnp.asarray(rng.uniform(0.5, 1.5, depth), jnp.float32)
    live_rows, mask = _spans(live, rows)
    run = jax.jit(lambda x, ws, live: matmul_quantized_cpu_group(x, ws, live_rows=live))
    normed = jax.jit(
        lambda x, nw, ws, live: matmul_quantized_cpu_group(
            NormedInput(x, nw, 1e-5), ws, live_rows=live
        )
    )
    # Normed rows may differ from XLA's in the last bit, which can move a code by one step.
    for inputs, outs, tolerance in [
        (x, run(x, packed, live_rows), 1e-5),
        (rms_norm(x, norm_weight, 1e-5), normed(x, norm_weight, packed, live_rows), 1e-3),
    ]:
        for weight, out in zip(weights, outs, strict=True):
            expected = np.asarray(weight.matmul(inputs), np.float64) * mask
            scale = np.abs(expected).max()
            np.testing.assert_allclose(out, expected, rtol=1e-5, atol=tolerance * scale)
    hlo = run.lower(x, packed, live_rows).as_text()
    assert hlo.count("jaxgen_matmul_quantized") == 1
    assert ("round" in hlo) == (not vnni)  # x's codes: in the kernel, or in XLA before it


def test_each_row_gets_its_result_alone():
    """1 to 9 rows (a verify step's tile, and one row past it): each row's output bit for bit
    the same as when it is the call's only row, as decoding without speculation computes it."""
    if not w8a8_kernel_available():
        pytest.skip("this CPU has no AVX-512 VNNI + VBMI")
    rng = np.random.default_rng(7)
    weight = quantize_kernel(rng.standard_normal((1536, 576)), W4A8["q4_1-g32"])
    matmul = jax.jit(PackedQuantizedWeight.pack(weight).matmul)
    x = jnp.asarray(rng.standard_normal((9, 1536)), jnp.float32)
    alone = np.concatenate([np.asarray(matmul(x[i : i + 1])) for i in range(9)])
    for rows in range(1, 10):
        np.testing.assert_array_equal(np.asarray(matmul(x[:rows])), alone[:rows])


def test_kept_weights_take_int8_activations_where_their_layout_allows():
    """``with_int8_activations`` (a GGUF tensor under "w4a8"): int4 and int8 weights whose K
    and groups are multiples of 32 take int8 codes; others, and fp8, keep float x."""
    rng = np.random.default_rng(0)

    def kept(kind, depth, group, **spec):
        spec = QuantizationSpec(kind=kind, group_size=group, **spec)
        return with_int8_activations(quantize_kernel(rng.standard_normal((depth, 16)), spec))

    assert kept("int4", 64, 32, asymmetric=True).activations == "int8"
    assert kept("int8", 64, 32).activations == "int8"
    assert kept("int4", 48, 16).activations == "float"  # groups of 16
    assert kept("int4", 40, 8).activations == "float"  # K not a multiple of 32
    assert kept("fp8", 64, None).activations == "float"
    with pytest.raises(ValueError, match="int16 activations need an int8 weight"):
        quantize_kernel(
            rng.standard_normal((64, 16)),
            QuantizationSpec(kind="int4", group_size=32, activations="int16"),
        )
