"""How an 8-bit KV pool stores its codes and scales, on every backend, and how a kernel reads
them back as float32."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

# An 8-bit pool's values: int8 codes, or fp8 (e4m3) codes held as their bits in uint8. XLA:CPU
# scatters new tokens into a uint8 array in place but copies a float8 array whole, so a float8
# pool would cost a step time in proportion to the pool.
EIGHT_BIT_DTYPES = (jnp.dtype(jnp.int8), jnp.dtype(jnp.uint8))


def codes_to_float(codes: jax.Array) -> jax.Array:
    """An 8-bit pool's codes as float32: int8 as is, uint8 as the fp8 (e4m3) values of its bits."""
    if codes.dtype == jnp.uint8:
        codes = lax.bitcast_convert_type(codes, jnp.float8_e4m3fn)
    return codes.astype(jnp.float32)


# An 8-bit KV pool's scales on every backend: one per token, KV head and SCALE_GROUP head_dim
# elements, i.e. one per head when head_dim is at most 128 or no multiple of it (a 256-wide head
# has two), in SCALE_DTYPE (paired pools store its bits as uint16).
SCALE_GROUP = 128
SCALE_DTYPE = jnp.dtype(jnp.bfloat16)


def scales_to_float(bits: jax.Array) -> jax.Array:
    """An 8-bit pool's scales, stored as the uint16 bits of bfloat16 values, as float32."""
    return lax.bitcast_convert_type(bits, SCALE_DTYPE).astype(jnp.float32)
