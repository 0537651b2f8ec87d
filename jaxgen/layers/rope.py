"""Rotary position embeddings, HF's rotate-half layout: default, linear, llama3 and LongRoPE
(Phi-3) frequency scaling, and a separate base for sliding layers (Gemma 3, ModernBERT).

A model's RoPE tables are non-trainable buffers (:func:`rope_buffers`), computed from the config
at load: ``inv_freq`` always, ``long_inv_freq`` for LongRoPE, ``local_inv_freq`` for Gemma 3.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxgen.config import ModelConfig


def base_frequencies(dim: int, theta: float) -> np.ndarray:  # [dim // 2] float64
    """Unscaled inverse frequencies ``theta ** (-2i / dim)`` of a rotary base (every model's
    RoPE starts here; ModernBERT's global and local layers each have their own base)."""
    return 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))


def inverse_frequencies(config: ModelConfig) -> np.ndarray:
    """Per-pair inverse frequencies ``[head_dim // 2]`` after the configured scaling (LongRoPE:
    the short factors)."""
    dim = config.head_dim
    inv_freq = base_frequencies(dim, config.rope_theta)
    scaling = config.rope_scaling
    if scaling.rope_type == "linear":
        inv_freq = inv_freq / scaling.factor
    elif scaling.rope_type == "longrope":
        inv_freq = inv_freq / np.asarray(scaling.short_factor, np.float64)
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


def rope_buffers(config: ModelConfig) -> dict[str, np.ndarray]:
    """Every RoPE table the model holds, by parameter name."""
    buffers = {"inv_freq": inverse_frequencies(config)}
    scaling = config.rope_scaling
    if scaling.rope_type == "longrope":
        base = base_frequencies(config.head_dim, config.rope_theta)
        long = base / np.asarray(scaling.long_factor, np.float64)
        buffers["long_inv_freq"] = long.astype(np.float32)
    if config.local_rope_theta is not None:
        local = base_frequencies(config.head_dim, config.local_rope_theta)
        buffers["local_inv_freq"] = local.astype(np.float32)
    return buffers


def rope_angles(
    positions: jax.Array,  # [T]
    inv_freq: jax.Array,  # [D // 2], or [T, D // 2] per row
    attention_factor: float = 1.0,
) -> tuple[jax.Array, jax.Array]:  # cos, sin [T, 1, D // 2]
    """Cosines and sines of each position's rotation, for every layer of a step (times
    LongRoPE's ``attention_factor``)."""
    inv_freq = inv_freq if inv_freq.ndim == 2 else inv_freq[None, :]
    angles = positions.astype(jnp.float32)[:, None] * inv_freq  # [T, D/2]
    # XLA still fuses cos and sin into each layer's rotation (one [T, D / 2] sincos per use).
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos[:, None, :], sin[:, None, :]


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
