"""Pure-jnp reference of ``rotary_embedding_tpu``."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rotary_embedding_reference(
    x: jax.Array,  # [T, H, D]
    cos: jax.Array,  # [T, D / 2] float32
    sin: jax.Array,  # [T, D / 2] float32
) -> jax.Array:  # [T, H, D]
    """Rotate-half RoPE in float32 (HF Llama's), cast back to ``x``'s dtype."""
    xf = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    x1, x2 = xf[..., :half], xf[..., half:]
    cos, sin = cos[:, None, :], sin[:, None, :]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)
