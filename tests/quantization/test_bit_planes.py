"""GGUF's 2-, 3-, 5- and 6-bit codes kept at their width (``jaxgen.quantization.bit_planes``):
the planes' byte layout, the kept weight of every such type equal to ``gguf.quants.dequantize``
bit for bit (eager, jitted, column lookups) at the file's bytes plus at most 0.125 bits a
weight, and the widened int8 / int4 form (what the "cpu" panels and the streamed TPU kernel
read) the same weight."""

from __future__ import annotations

import dataclasses

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgen.loaders.gguf_blocks import BLOCK_LAYOUTS, decode_blocks
from jaxgen.loaders.gguf_loader import kept_weight
from jaxgen.quantization import QuantizedWeight
from jaxgen.quantization.bit_planes import (
    CODE_BITS,
    PLANES,
    pack_planes,
    unpack_planes,
    unpack_scale_codes,
    widen,
)
from tests.gguf_quant_blocks import random_gguf_tensor

# type -> (kind, widened kind, bits a weight over the file's: its 6-bit sub-block codes in 8)
PACKED_TYPES = {
    "Q5_0": ("int5", "int8", 0.0),
    "Q5_1": ("int5", "int8", 0.0),
    "Q2_K": ("int2", "int4", 0.0),
    "Q3_K": ("int3", "int4", 0.125),
    "Q5_K": ("int5", "int8", 0.125),
    "Q6_K": ("int6", "int8", 0.0),
}
SHAPES = [(256, 1), (512, 7), (1024, 24), (2816, 3)]  # [K, N]: K in whole 256-blocks


@pytest.mark.parametrize("kind", list(PLANES))
def test_planes_round_trip_and_lie_per_8_rows(kind):
    bits = CODE_BITS[kind]
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 1 << bits, (64, 5), dtype=np.uint8)
    packed = pack_planes(codes, kind)
    assert packed.shape == (64 * bits // 8, 5) and packed.dtype == np.uint8
    np.testing.assert_array_equal(unpack_planes(packed, kind, 64, 5), codes)
    np.testing.assert_array_equal(
        np.asarray(unpack_planes(jnp.asarray(packed), kind, 64, 5)), codes
    )
    # Block b of a column is bytes [bits b, bits (b + 1)): changing one row touches only those.
    changed = codes.copy()
    changed[8 * 3 + 5, 2] ^= 1 << (bits - 1)
    differs = np.nonzero(pack_planes(changed, kind) != packed)
    assert set(differs[1]) == {2} and set(differs[0] // bits) == {3}


def test_a_five_bit_block_is_its_nibbles_then_its_fifth_bits():
    codes = np.array([[1], [2], [3], [4], [5], [6], [7], [31]], np.uint8)  # one 8-row block
    assert pack_planes(codes, "int5")[:, 0].tolist() == [0x21, 0x43, 0x65, 0xF7, 0x80]
    assert pack_planes(codes, "int6")[:, 0].tolist() == [0x21, 0x43, 0x65, 0xF7, 0x00, 0x40]
    # 2-bit plane: rows 0-3 (1, 2, 3, 0) then 4-7 (1, 2, 3, 3), two bits each from bit 0 up;
    # the third bits (rows 3-7 have it) one a row
    assert pack_planes(codes & 7, "int3")[:, 0].tolist() == [0b00111001, 0b11111001, 0b11111000]
    assert pack_planes(codes & 3, "int2")[:, 0].tolist() == [0b00111001, 0b11111001]


@pytest.mark.parametrize("qtype", list(PACKED_TYPES))
@pytest.mark.parametrize("depth, columns", SHAPES)
def test_kept_weight_is_the_files_at_the_files_bytes(qtype, depth, columns):
    kind, widened_kind, extra_bits = PACKED_TYPES[qtype]
    data = random_gguf_tensor(qtype, columns, depth, np.random.default_rng(depth + columns))
    expected = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[qtype]).T
    weight = kept_weight(decode_blocks(qtype, data, columns, depth))
    assert weight.kind == kind and weight.values.dtype == np.uint8
    assert weight.values.shape == (depth * CODE_BITS[kind] // 8, columns)
    file_bits = 8 * data.nbytes / (depth * columns)
    assert file_bits == 8 * BLOCK_LAYOUTS[qtype][1] / BLOCK_LAYOUTS[qtype][0]
    assert 8 * weight.nbytes / (depth * columns) == file_bits + extra_bits
    device = jax.tree_util.tree_map(jnp.asarray, weight)
    np.testing.assert_array_equal(np.asarray(device.dequantize()), expected)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda w: w.dequantize())(device)), expected)
    ids = jnp.asarray([columns - 1, 0, columns // 2], jnp.int32)
    np.testing.assert_array_equal(np.asarray(device.take_columns(ids)), expected.T[np.asarray(ids)])
    wide = widen(device)
    assert wide.kind == widened_kind and (
        wide.scale_codes is None or wide.scale_codes.dtype == jnp.int8
    )
    np.testing.assert_array_equal(np.asarray(wide.dequantize()), expected)
    np.testing.assert_array_equal(np.asarray(device.plain_layout().dequantize()), expected)


def test_q2_k_keeps_its_four_bit_sub_block_codes_two_a_byte():
    data = random_gguf_tensor("Q2_K", 3, 512, np.random.default_rng(0))
    decoded = decode_blocks("Q2_K", data, 3, 512)
    weight = kept_weight(decoded)
    assert decoded.scale_code_bits == 4 and weight.scale_codes.shape == (16, 3)
    np.testing.assert_array_equal(unpack_scale_codes(weight.scale_codes), decoded.scale_codes.T)
    np.testing.assert_array_equal(unpack_scale_codes(weight.min_codes), decoded.min_codes.T)
    assert widen(weight).scale_codes.shape == (32, 3)


def test_widened_layout_from_shapes_alone():
    data = random_gguf_tensor("Q2_K", 8, 256, np.random.default_rng(1))
    weight = kept_weight(decode_blocks("Q2_K", data, 8, 256))
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree_util.tree_map(
        lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding), weight
    )
    wide = widen(abstract)
    assert (wide.kind, wide.values.shape, wide.values.dtype) == ("int4", (128, 8), jnp.uint8)
    assert (wide.scale_codes.shape, wide.scale_codes.dtype) == ((16, 8), jnp.int8)
    assert wide.values.sharding == sharding
    assert widen(wide) is wide


def test_a_bit_plane_group_is_whole_blocks_of_8_rows():
    with pytest.raises(ValueError, match="int2 group_size must be a multiple of 8"):
        QuantizedWeight(
            jnp.zeros((64, 8), jnp.uint8), jnp.ones((64, 8), jnp.float16), None,
            kind="int2", group_size=4, shape=(256, 8),
        )  # fmt: skip


def test_four_bit_scale_codes_must_pair_the_groups():
    data = random_gguf_tensor("Q2_K", 8, 256, np.random.default_rng(2))
    weight = kept_weight(decode_blocks("Q2_K", data, 8, 256))
    with pytest.raises(ValueError, match="4-bit"):
        dataclasses.replace(weight, scale_codes=jnp.ones((7, 8), jnp.uint8))
