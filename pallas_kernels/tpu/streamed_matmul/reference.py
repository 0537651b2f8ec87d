"""Pure-jnp references of the streamed matmuls: the product, the gated product, the norm."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.tpu.streamed_matmul.elementwise import gated


def streamed_matmul_reference(
    x: jax.Array, w: jax.Array, *, transposed: bool = False
) -> jax.Array:  # [M, N]
    """Pure-jnp ``x @ w`` (``x @ w.T`` when ``transposed``), f32 accumulation, x's dtype."""
    weight = w.T if transposed else w
    return jnp.dot(x, weight, preferred_element_type=jnp.float32).astype(x.dtype)


def rms_norm_reference(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:  # [M, K]
    """RMSNorm as ``jaxgen.models.llama.RMSNorm`` computes it: ``x / rms(x)`` in float32, cast
    to x's dtype, times ``weight`` ([K], x's dtype); the input the ``norm=`` calls multiply."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return xf.astype(x.dtype) * weight


def streamed_gated_matmul_reference(
    x: jax.Array,  # [M, K]
    gate: jax.Array,  # [K, N] (a dequantised weight, for the quantised kernel)
    up: jax.Array,  # [K, N]
    activation: str,
) -> jax.Array:  # [M, N], x's dtype
    """``act(x @ gate) * (x @ up)`` as the gated kernels round it (``elementwise.gated``)."""
    gate_product = jnp.dot(x, gate.astype(x.dtype), preferred_element_type=jnp.float32)
    up_product = jnp.dot(x, up.astype(x.dtype), preferred_element_type=jnp.float32)
    return gated(gate_product, up_product, activation, x.dtype)
