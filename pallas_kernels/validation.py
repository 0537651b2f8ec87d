"""Argument checks the paged-attention wrappers share: each raises a ``ValueError`` naming the
argument, while the call is traced (before anything is lowered)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

FLOAT_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def validate_common(
    q, k_pages, v_pages, *, scale, soft_cap, sliding_window, pool_dtypes=FLOAT_DTYPES
) -> None:
    """q ``[T, Hq, D]`` against a pool ``[Hkv, P, S, D]``, and the logit options.
    ``pool_dtypes``: the pool dtypes accepted (``kv_codes.EIGHT_BIT_DTYPES`` for an 8-bit pool)."""
    if q.ndim != 3:
        raise ValueError(f"q must have rank 3, got shape {q.shape}")
    if k_pages.ndim != 4:
        raise ValueError(
            f"k_pages must be [num_kv_heads, num_pages, page_size, head_dim], got {k_pages.shape}"
        )
    if v_pages.shape != k_pages.shape:
        raise ValueError(f"v_pages shape {v_pages.shape} != k_pages shape {k_pages.shape}")
    if q.dtype not in FLOAT_DTYPES:
        raise ValueError(f"q dtype must be float32, bfloat16 or float16, got {q.dtype}")
    if k_pages.dtype not in pool_dtypes or v_pages.dtype != k_pages.dtype:
        raise ValueError(
            f"k_pages and v_pages must share a dtype of {[str(d) for d in pool_dtypes]}, got "
            f"{k_pages.dtype}, {v_pages.dtype}"
        )
    num_heads, head_dim = q.shape[1:]
    num_kv_heads = k_pages.shape[0]
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(
            f"q heads ({num_heads}) must be a multiple of k_pages heads ({num_kv_heads})"
        )
    if k_pages.shape[3] != head_dim:
        raise ValueError(f"k_pages head_dim {k_pages.shape[3]} != q head_dim {head_dim}")
    if scale is not None and not scale > 0:
        raise ValueError(f"scale must be positive, got {scale}")
    if soft_cap is not None and not soft_cap > 0:
        raise ValueError(f"soft_cap must be positive, got {soft_cap}")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")


def validate_scales(values, k_scales, v_scales) -> None:
    """An 8-bit pool's scales: the uint16 bits of bfloat16 values, ``[Hkv, P, S, G]`` beside
    ``values`` [Hkv, P, S, D], G dividing D."""
    groups = k_scales.shape[-1] if k_scales.ndim == 4 else 0
    for name, scales in (("k_pages.scales", k_scales), ("v_pages.scales", v_scales)):
        if scales.shape != (*values.shape[:3], groups) or scales.dtype != jnp.uint16:
            raise ValueError(
                f"{name} must be uint16 (bfloat16 bits) [Hkv, P, S, G] beside values "
                f"{values.shape}, got {scales.dtype} {scales.shape}"
            )
    if not groups or values.shape[-1] % groups:
        raise ValueError(
            f"k_pages.scales: {groups} scale groups must divide head_dim {values.shape[-1]}"
        )


def validate_int_array(name: str, array: jax.Array, shape: tuple[int, ...]) -> None:
    """Raises ``ValueError`` unless ``array`` is int32 with the given shape."""
    if array.dtype != jnp.int32:
        raise ValueError(f"{name} must be int32, got {array.dtype}")
    if array.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {array.shape}")
