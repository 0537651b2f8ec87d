"""Rotary position embeddings (default, linear and llama3 frequency scaling), HF's rotate-half layout."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxgen.config import ModelConfig


def inverse_frequencies(config: ModelConfig) -> np.ndarray:
    """Per-pair inverse frequencies ``[head_dim // 2]`` after the configured scaling."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    scaling = config.rope_scaling
    if scaling.rope_type == "linear":
        inv_freq = inv_freq / scaling.factor
    elif scaling.rope_type == "llama3":
        old_len = scaling.original_max_position_embeddings
        low_wavelen = old_len / scaling.low_freq_factor
        high_wavelen = old_len / scaling.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
        smooth = (old_len / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = np.where(medium, smoothed, scaled)
    return inv_freq.astype(np.float32)


def rope_angles(
    positions: jax.Array,  # [T]
    inv_freq: jax.Array,  # [D // 2]
) -> tuple[jax.Array, jax.Array]:  # cos, sin [T, 1, D // 2]
    """Cosines and sines of each position's rotation, for every layer of a step."""
    angles = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]  # [T, D/2]
    # XLA still fuses cos and sin into each layer's rotation (one [T, D / 2] sincos per use).
    return jnp.cos(angles)[:, None, :], jnp.sin(angles)[:, None, :]


def apply_rope(
    x: jax.Array,  # [T, H, D]
    rope: tuple[jax.Array, jax.Array],  # rope_angles(positions, inv_freq)
) -> jax.Array:  # [T, H, D]
    """Rotates ``x`` by its positions (rotate-half convention, as in HF Llama)."""
    cos, sin = rope
    xf = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    x1, x2 = xf[..., :half], xf[..., half:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)
