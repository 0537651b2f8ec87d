"""The elementwise math around a streamed product, shared by the kernels and their references: the
RMSNorm a ``norm=`` call applies to x first, and the gated MLP's ``act(gate) * up`` after."""

from __future__ import annotations

import jax
import jax.numpy as jnp

# The gated MLP's activations the gated kernels compute (``jaxgen.models.mlp``'s names).
GATED_ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
}


def check_activation(activation: str) -> None:
    """A ValueError for an activation the gated kernels do not compute."""
    if activation not in GATED_ACTIVATIONS:
        raise ValueError(
            f"activation must be one of {', '.join(map(repr, GATED_ACTIVATIONS))}, "
            f"got {activation!r}"
        )


def gated(gate, up, activation: str, dtype):
    """``act(gate) * up`` of two float32 products, each first rounded to ``dtype`` as the
    unfused layers' outputs are; computed in float32, rounded once."""
    gate = gate.astype(dtype).astype(jnp.float32)
    up = up.astype(dtype).astype(jnp.float32)
    return (GATED_ACTIVATIONS[activation](gate) * up).astype(dtype)


def rms_normed(parts: list, weights: list, eps: float, depth: int) -> list:
    """RMSNorm of rows held in ``parts`` ([M, K_i] each, together the ``depth`` elements of a
    row; ``weights``: the norm's [1, K_i] pieces), as ``jaxgen.layers.linear.rms_norm`` rounds it:
    ``x / rms(x)`` in float32 rounded to x's dtype, times the weight, rounded again."""
    dtype = parts[0].dtype
    floats = [part.astype(jnp.float32) for part in parts]
    squares = sum(jnp.sum(part * part, axis=-1, keepdims=True) for part in floats)
    inverse = jax.lax.rsqrt(squares / depth + eps)  # [M, 1]
    return [
        ((part * inverse).astype(dtype).astype(jnp.float32) * w.astype(jnp.float32)).astype(dtype)
        for part, w in zip(floats, weights, strict=True)
    ]
