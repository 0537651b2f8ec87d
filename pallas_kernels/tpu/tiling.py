"""How Mosaic tiles a TPU's vector registers, as the kernels here size their blocks by it: 128
lanes of 32-bit words, 8 sublanes, narrower dtypes packed several to a word."""

from __future__ import annotations

import jax.numpy as jnp

LANES = 128


def cdiv(a, b):
    return (a + b - 1) // b


def dtype_packing(dtype) -> int:
    """Elements of ``dtype`` per 32-bit word (1 for f32, 2 for bf16, 4 for int8)."""
    return 4 // jnp.dtype(dtype).itemsize


def sublane_rows(dtype) -> int:
    """Rows of ``dtype`` in one (8, 128) tile of 32-bit words."""
    return 8 * dtype_packing(dtype)
