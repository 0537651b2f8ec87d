"""The native CPU matmul on every kept GGUF layout (``jaxgen.loaders.gguf_blocks``: float32
scales, int8 codes with minimums, groups of 16) against the float64 product of the file's
dequantised weight: every row-tile path (1-8 rows in registers, more over a shared dequantised
slice), a normed input, weights of several layouts sharing buffers, and int8 activations kept
only where the W8A8 / W4A8 kernels take the layout."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgen.backends.cpu_kernels import (
    PackedQuantizedWeight,
    can_pack_quantized,
    matmul_quantized,
    pack_shared,
    quantized_matmul_available,
)
from jaxgen.layers.linear import NormedInput, rms_norm
from jaxgen.quantization import QuantizedWeight
from jaxgen.quantization.quantize import with_int8_activations
from tests.gguf_quant_blocks import KEPT_GGUF_TYPES, kept_weight

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "cpu" or not quantized_matmul_available(),
    reason="needs the CPU backend, a C++ compiler and AVX2 + FMA + F16C",
)


def _reference(x, weight: QuantizedWeight) -> np.ndarray:
    return np.asarray(x, np.float64) @ np.asarray(weight.dequantize(), np.float64)


def _close(actual, x, weight):
    expected = _reference(x, weight)
    scale = np.abs(np.asarray(x, np.float64)) @ np.abs(np.asarray(weight.dequantize(), np.float64))
    assert np.all(np.abs(np.asarray(actual, np.float64) - expected) <= 1e-5 * scale + 1e-6)


@pytest.mark.parametrize("qtype", KEPT_GGUF_TYPES)
def test_every_row_count_matches_the_dequantised_product(qtype):
    weight = kept_weight(qtype, 512, 40)
    assert can_pack_quantized(weight)
    packed = PackedQuantizedWeight.pack(weight)
    run = jax.jit(lambda x, w: w.matmul(x))
    x = jnp.asarray(np.random.default_rng(1).standard_normal((67, 512)), jnp.float32)
    for rows in (1, 2, 3, 5, 7, 8, 9, 67):
        _close(run(x[:rows], packed), x[:rows], weight)


@pytest.mark.parametrize("qtype", ["IQ4_NL", "IQ4_XS"])
def test_codebook_lookups_in_the_kernel_match_the_dequantised_product(qtype, monkeypatch):
    """Packed as their 4-bit indices (``LOOK_UP_CODEBOOKS``), looked up in registers: every
    row-tile path, alone and in shared buffers; by default the int8 values are packed."""
    weight = kept_weight(qtype, 512, 40)
    assert PackedQuantizedWeight.pack(weight).bits == 8
    monkeypatch.setattr(matmul_quantized, "LOOK_UP_CODEBOOKS", True)
    packed = PackedQuantizedWeight.pack(weight)
    assert packed.bits == 4 and packed.codebook == weight.codebook and packed.mins is None
    run = jax.jit(lambda x, w: w.matmul(x))
    x = jnp.asarray(np.random.default_rng(1).standard_normal((67, 512)), jnp.float32)
    for rows in (1, 2, 3, 4, 5, 7, 8, 9, 67):
        _close(run(x[:rows], packed), x[:rows], weight)
    (shared,) = pack_shared([weight])
    assert shared.codebook == weight.codebook
    _close(run(x[:3], shared), x[:3], weight)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q5_1", "Q6_K"])
def test_normed_input_and_live_rows(qtype):
    weight = kept_weight(qtype, 256, 48, seed=2)
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((6, 256)), jnp.float32)
    norm = jnp.asarray(1 + 0.1 * rng.standard_normal(256), jnp.float32)
    live = jnp.asarray([[0, 2], [3, 6]], jnp.int32)
    packed = PackedQuantizedWeight.pack(weight)
    actual = jax.jit(lambda x, w, n: w.matmul(NormedInput(x, n, 1e-5), live))(x, packed, norm)
    normed = rms_norm(x, norm, 1e-5)
    expected_rows = np.r_[0:2, 3:6]
    _close(np.asarray(actual)[expected_rows], normed[expected_rows], weight)
    np.testing.assert_array_equal(np.asarray(actual)[2], 0)


def test_layouts_sharing_buffers_and_one_call_groups():
    """Weights of every layout packed into shared buffers (float16 and float32 scales in their
    own buffers); ``matmul_group`` splits them into one call per layout."""
    weights = [kept_weight(qtype, 256, 24 + i, seed=i) for i, qtype in enumerate(KEPT_GGUF_TYPES)]
    shared = pack_shared(weights)
    x = jnp.asarray(np.random.default_rng(4).standard_normal((3, 256)), jnp.float32)
    outs = jax.jit(lambda x, ws: PackedQuantizedWeight.matmul_group(x, ws))(x, shared)
    for out, weight in zip(outs, weights, strict=True):
        _close(out, x, weight)


@pytest.mark.parametrize("qtype", KEPT_GGUF_TYPES)
def test_int8_activations_only_where_the_integer_kernels_take_the_layout(qtype):
    weight = with_int8_activations(kept_weight(qtype, 256, 32))
    takes = qtype in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "IQ4_NL")
    assert (weight.activations == "int8") == takes
    assert can_pack_quantized(weight)
