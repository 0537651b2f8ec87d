"""``QuantizedWeight``'s compact GGUF layouts: two-level scales (the K-quants and IQ4_XS: a
float16 super-block scale times an int8 code per group; the group scales are the float32
products) and int4 codes indexing a codebook (IQ4_NL / IQ4_XS): the weight is its plain layout's
(float32 scales per group, int8 values) bit for bit through every consumer (dequantise, column
lookup, the row-major embedding table, int8 activations), and a malformed layout is a
``ValueError``."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgen.quantization import QuantizedWeight
from jaxgen.quantization.quantize import with_int8_activations
from jaxgen.quantization.quantized_embedding_table import QuantizedEmbeddingTable
from tests.gguf_quant_blocks import kept_weight

TWO_LEVEL_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")


@pytest.mark.parametrize("qtype", TWO_LEVEL_TYPES)
def test_plain_layout_is_the_same_weight_and_every_lookup_agrees(qtype):
    weight = kept_weight(qtype, 512, 24, seed=3)
    assert weight.two_level and weight.dtype == jnp.float32
    flat = weight.plain_layout()
    assert not flat.two_level and flat.scales.dtype == jnp.float32
    assert flat.scales.shape == (weight.shape[0] // weight.group_size, weight.shape[1])
    widened = {"IQ4_XS": "int8", "Q2_K": "int4", "Q3_K": "int4", "Q5_K": "int8", "Q6_K": "int8"}
    assert flat.codebook is None and flat.kind == widened.get(qtype, weight.kind)
    np.testing.assert_array_equal(np.asarray(flat.dequantize()), np.asarray(weight.dequantize()))
    supers = np.repeat(np.asarray(weight.scales, np.float32), weight.groups_per_super, axis=0)
    codes = np.asarray(weight.scale_codes)
    if qtype == "Q2_K":  # 4-bit codes, two a byte: group 2i in the low nibble
        codes = np.stack([codes & 15, codes >> 4], axis=1).reshape(-1, codes.shape[1])
    np.testing.assert_array_equal(
        np.asarray(weight.group_scales()), supers * codes.astype(np.float32)
    )
    ids = jnp.asarray([3, 0, 23, 3], jnp.int32)
    columns = np.asarray(weight.take_columns(ids))
    np.testing.assert_array_equal(columns, np.asarray(weight.dequantize()).T[[3, 0, 23, 3]])
    table = QuantizedEmbeddingTable.from_kernel(weight)
    np.testing.assert_array_equal(np.asarray(table.take_columns(ids)), columns)
    assert with_int8_activations(weight) is weight  # the integer kernels read one-level scales


@pytest.mark.parametrize("qtype, groups, kind", [("Q4_K", 8, "int4"), ("Q2_K", 16, "int4")])
def test_plain_layout_of_shapes_alone(qtype, groups, kind):
    weight = kept_weight(qtype, 256, 16)
    abstract = jax.tree_util.tree_map(
        lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), weight
    )
    flat = abstract.plain_layout()
    assert (flat.scales.shape, flat.scales.dtype) == ((groups, 16), jnp.float32)
    assert (flat.mins.shape, flat.scale_codes) == ((groups, 16), None)
    assert (flat.kind, flat.values.shape) == (kind, (128, 16))


def test_two_level_weights_pass_through_jit_and_count_their_bytes():
    weight = kept_weight("Q6_K", 256, 32)
    twice = jax.jit(lambda w: w.dequantize() * 2)(weight)
    np.testing.assert_array_equal(np.asarray(twice), 2 * np.asarray(weight.dequantize()))
    # 6-bit codes (bit planes), an int8 code per 16 weights, a float16 number per 256
    assert weight.nbytes * 8 / (256 * 32) == 6 + 8 / 16 + 16 / 256


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda w: dict(scale_codes=w.scale_codes.astype(jnp.int16)), "int8 codes"),
        (lambda w: dict(scales=w.scales.astype(jnp.float32)), "float16 super-block"),
        (lambda w: dict(scales=jnp.concatenate([w.scales] * 3)), "super-block"),
        (lambda w: dict(min_codes=None), "both mins"),
        (lambda w: dict(scale_codes=None), "min_codes need scale_codes"),
        (lambda w: dict(activations="int8"), "float activations"),
    ],
)
def test_malformed_two_level_layouts_are_value_errors(change, message):
    weight = kept_weight("Q4_K", 256, 16)
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(weight, **change(weight))


def test_codebook_codes_are_four_bit_indices_and_int8_activations_read_their_values():
    weight = kept_weight("IQ4_NL", 256, 16)
    assert weight.kind == "int4" and weight.codebook is not None and not weight.two_level
    assert weight.nbytes * 8 / (256 * 16) == 4 + 16 / 32  # the file's 4.5 bits a weight
    plain = weight.plain_layout()
    assert plain.kind == "int8" and set(np.unique(plain.values)) <= set(weight.codebook)
    np.testing.assert_array_equal(np.asarray(plain.dequantize()), np.asarray(weight.dequantize()))
    table = QuantizedEmbeddingTable.from_kernel(weight)
    ids = jnp.asarray([2, 15], jnp.int32)
    np.testing.assert_array_equal(
        np.asarray(table.take_columns(ids)), np.asarray(weight.take_columns(ids))
    )
    w8a8 = with_int8_activations(weight)  # float16 scales: the W8A8 kernel takes its values
    assert (w8a8.kind, w8a8.activations, w8a8.codebook) == ("int8", "int8", None)
    xs = kept_weight("IQ4_XS", 256, 16)  # two-level: stays as it is, float activations
    assert with_int8_activations(xs) is xs


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(codebook=tuple(range(15))), "16 integers"),
        (dict(codebook=(200,) * 16), "16 integers"),
        (dict(kind="int8", values=jnp.zeros((256, 16), jnp.int8)), "indexes an int4 weight"),
        (dict(mins=jnp.zeros((8, 16), jnp.float16)), "without mins"),
    ],
)
def test_malformed_codebooks_are_value_errors(change, message):
    weight = kept_weight("IQ4_NL", 256, 16)
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(weight, **change)


def test_plain_weights_are_unchanged():
    weight = QuantizedWeight(
        jnp.ones((64, 8), jnp.int8), jnp.ones((2, 8), jnp.float16), None,
        kind="int8", group_size=32, shape=(64, 8),
    )  # fmt: skip
    assert not weight.two_level and weight.plain_layout() is weight
    assert weight.groups_per_super == 1 and weight.dtype == jnp.float16
