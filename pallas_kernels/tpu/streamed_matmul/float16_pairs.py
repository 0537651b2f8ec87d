"""float16 scales kept 16-bit on a TPU without float16 vectors: the bit patterns of two groups
packed in one int32 word, turned back into float32 in the kernel with integer ops."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def pack_float16_pairs(values: jax.Array, pieces: int = 1) -> jax.Array:
    """``[G, N]`` float16 -> ``[G / 2, N]`` int32 words holding the bit patterns of groups ``j``
    (low half) and ``j + G_p / 2`` (high half) of each of ``pieces`` row blocks of ``G_p = G /
    pieces`` groups (one per chip when the groups are split over chips, so each chip's words
    pair its own groups)."""
    groups, columns = values.shape
    if values.dtype != jnp.float16 or groups % (2 * pieces):
        raise ValueError(
            f"values must be float16 with a multiple of {2 * pieces} groups, got "
            f"{values.dtype} {values.shape}"
        )
    bits = jax.lax.bitcast_convert_type(values, jnp.uint16).astype(jnp.uint32)
    bits = bits.reshape(pieces, 2, groups // (2 * pieces), columns)
    words = bits[:, 0] | (bits[:, 1] << 16)
    return jax.lax.bitcast_convert_type(words, jnp.int32).reshape(groups // 2, columns)


def unpack_float16_pairs(words: jax.Array, pieces: int = 1) -> jax.Array:
    """The inverse of :func:`pack_float16_pairs`: ``[G / 2, N]`` int32 -> ``[G, N]`` float16."""
    half, columns = words.shape
    bits = jax.lax.bitcast_convert_type(words, jnp.uint32).reshape(pieces, 1, -1, columns)
    halves = jnp.concatenate([bits & 0xFFFF, bits >> 16], axis=1).astype(jnp.uint16)
    return jax.lax.bitcast_convert_type(halves, jnp.float16).reshape(2 * half, columns)


def float16_bits_to_float32(bits: jax.Array) -> jax.Array:
    """float16 bit patterns (int32 in ``[0, 2**16)``) as float32, exactly, with integer ops and
    a bitcast (no float16 vectors): normals move their exponent and mantissa into float32's
    fields, subnormals are ``mantissa * 2**-24``. Infinities and NaNs are not handled (scales
    are finite)."""
    sign = (bits & 0x8000) << 16
    exponent = (bits >> 10) & 0x1F
    mantissa = bits & 0x3FF
    normal = jax.lax.bitcast_convert_type(
        sign | ((exponent + 112) << 23) | (mantissa << 13), jnp.float32
    )
    subnormal = mantissa.astype(jnp.float32) * (2.0**-24)
    subnormal = jnp.where(sign != 0, -subnormal, subnormal)
    return jnp.where(exponent == 0, subnormal, normal)


def words_to_float32(buffer: jax.Array) -> jax.Array:
    """``[G, W]`` float scales as float32, or ``[G / 2, W]`` packed pairs as ``[G, W]`` float32
    (each word's low half first, as :func:`pack_float16_pairs` lays them)."""
    if buffer.dtype != jnp.int32:
        return buffer.astype(jnp.float32)
    low = float16_bits_to_float32(buffer & 0xFFFF)
    high = float16_bits_to_float32((buffer >> 16) & 0xFFFF)
    return jnp.concatenate([low, high], axis=0)
