"""The native int4 x int8-activation matmul (W4A8, ``quantization="w4a8"``) beyond the shared
integer-activation test (``test_matmul_quantized_cpu.py``: groups of weights, live spans, the
norm prologue, the XLA fallback): groups of 128, a full 8-row tile and one row past it against
``QuantizedWeight.matmul``; every row's result bit for bit the one it gets alone (a verify
step's rows and decoding without speculation agree); which kept weights take int8 codes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgen.backends.cpu_kernels import (
    PackedQuantizedWeight,
    quantized_matmul_available,
    w8a8_kernel_available,
)
from jaxgen.quantization import QuantizationSpec, quantize_kernel
from jaxgen.quantization.quantize import with_int8_activations

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "cpu" or not quantized_matmul_available(),
    reason="needs the CPU backend, a C++ compiler and AVX2 + FMA + F16C",
)
needs_vnni = pytest.mark.skipif(
    jax.default_backend() != "cpu" or not w8a8_kernel_available(),
    reason="this CPU has no AVX-512 VNNI + VBMI",
)

Q4_1 = QuantizationSpec(kind="int4", group_size=32, asymmetric=True, activations="int8")


@needs_vnni
@pytest.mark.parametrize("group", [32, 128])
def test_full_tiles_and_wider_groups_match_the_reference(group):
    """8 rows (one full tile) and 9 (a tile and a row) over 640-deep weights in groups of 32
    and 128 (a weight group spans several activation groups)."""
    rng = np.random.default_rng(group)
    spec = QuantizationSpec(kind="int4", group_size=group, asymmetric=True, activations="int8")
    weight = quantize_kernel(rng.standard_normal((640, 200)), spec)
    matmul = jax.jit(PackedQuantizedWeight.pack(weight).matmul)
    for rows in (8, 9):
        x = jnp.asarray(rng.standard_normal((rows, 640)) * 3, jnp.float32)
        expected = np.asarray(weight.matmul(x), np.float64)
        scale = np.abs(expected).max()
        np.testing.assert_allclose(matmul(x), expected, rtol=1e-5, atol=1e-5 * scale)


@needs_vnni
def test_each_row_gets_its_result_alone():
    """1 to 9 rows (a verify step's tile, and one row past it): each row's output bit for bit
    the same as when it is the call's only row, as decoding without speculation computes it."""
    rng = np.random.default_rng(7)
    weight = quantize_kernel(rng.standard_normal((1536, 576)), Q4_1)
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
