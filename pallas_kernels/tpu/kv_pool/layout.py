"""The KV pool layout the TPU kernels read and write.

One pool array per layer:

  kv_pages: [num_pages, page_size, 2 * num_kv_heads_padded, head_dim_padded]

K and V heads are interleaved along axis 2 (k0, v0, k1, v1, ...), so one token of one page is a
``[2 * Hkv_p, Dp]`` tile: rows on sublanes, ``head_dim`` on lanes. ``head_dim`` is padded up to a
multiple of 128 lanes (64 -> 128). The number of KV heads is padded so that the interleaved rows,
counted in 32-bit words (two bf16 rows share a word), number 1, 2, 4 or a multiple of 8: the pool
then has no tiling padding in HBM and a block of pages can be viewed as one ``[rows, Dp]`` slab in
VMEM. For bf16, K and V of a head share a 32-bit word (K in the low half), which the attention
kernel splits with shifts. Padding heads and lanes are never read for the output.

Page 0 is the engine's scratch page: padding tokens' slots point into it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.tpu.tiling import LANES, dtype_packing

POOL_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))


def padded_head_dim(head_dim: int) -> int:
    """``head_dim`` rounded up to whole 128-lane vregs."""
    return -(-head_dim // LANES) * LANES


def tile_friendly(words: int) -> bool:
    """Whether ``words`` rows of 32-bit words tile a vreg's 8 sublanes without padding."""
    return words in (1, 2, 4) or words % 8 == 0


def padded_num_kv_heads(num_kv_heads: int, dtype) -> int:
    """Smallest head count >= ``num_kv_heads`` whose interleaved K/V rows tile without padding."""
    packing = dtype_packing(dtype)
    heads = num_kv_heads
    while (2 * heads) % packing or not tile_friendly(2 * heads // packing):
        heads += 1
    return heads


def kv_pool_shape(
    num_pages: int, page_size: int, num_kv_heads: int, head_dim: int, dtype
) -> tuple[int, int, int, int]:
    """Shape of one layer's pool: ``(P, S, 2 * Hkv_p, Dp)``."""
    if jnp.dtype(dtype) not in POOL_DTYPES:
        raise ValueError(f"dtype must be float32 or bfloat16, got {jnp.dtype(dtype)}")
    return (
        num_pages,
        page_size,
        2 * padded_num_kv_heads(num_kv_heads, dtype),
        padded_head_dim(head_dim),
    )


def interleave_kv(
    k: jax.Array,  # [..., Hkv, D]
    v: jax.Array,  # [..., Hkv, D]
    *,
    num_rows: int | None = None,
    head_dim_padded: int | None = None,
) -> jax.Array:  # [..., 2 * Hkv_p, Dp]
    """Interleaves K and V heads into pool rows (k0, v0, k1, v1, ...), zero-padding heads/lanes."""
    *lead, num_kv_heads, head_dim = k.shape
    num_rows = num_rows or 2 * padded_num_kv_heads(num_kv_heads, k.dtype)
    head_dim_padded = head_dim_padded or padded_head_dim(head_dim)
    kv = jnp.stack([k, v], axis=-2).reshape(*lead, 2 * num_kv_heads, head_dim)  # [..., 2Hkv, D]
    pad = [(0, 0)] * len(lead) + [(0, num_rows - 2 * num_kv_heads), (0, head_dim_padded - head_dim)]
    return jnp.pad(kv, pad)


def deinterleave_kv(
    kv: jax.Array,  # [..., 2 * Hkv_p, Dp]
    num_kv_heads: int,
    head_dim: int,
) -> tuple[jax.Array, jax.Array]:  # 2 x [..., Hkv, D]
    """Inverse of :func:`interleave_kv`: drops padding heads and lanes."""
    return kv[..., 0 : 2 * num_kv_heads : 2, :head_dim], kv[
        ..., 1 : 2 * num_kv_heads : 2, :head_dim
    ]
