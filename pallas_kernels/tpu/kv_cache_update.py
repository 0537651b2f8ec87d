"""KV pool layout for the TPU kernels, and a Pallas kernel that writes a step's new K/V rows.

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

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

LANES = 128
POOL_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))


def dtype_packing(dtype) -> int:
    """Elements of ``dtype`` per 32-bit word (1 for f32, 2 for bf16)."""
    return 4 // jnp.dtype(dtype).itemsize


def padded_head_dim(head_dim: int) -> int:
    """``head_dim`` rounded up to whole 128-lane vregs."""
    return -(-head_dim // LANES) * LANES


def _tile_friendly(words: int) -> bool:
    return words in (1, 2, 4) or words % 8 == 0


def padded_num_kv_heads(num_kv_heads: int, dtype) -> int:
    """Smallest head count >= ``num_kv_heads`` whose interleaved K/V rows tile without padding."""
    packing = dtype_packing(dtype)
    heads = num_kv_heads
    while (2 * heads) % packing or not _tile_friendly(2 * heads // packing):
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


def _update_kernel(
    slots_ref,  # [T] SMEM: slot = page * page_size + offset
    new_kv_hbm,  # [T, C, Dp] HBM
    pool_in_hbm,  # [P, S, C, Dp] HBM, aliased with pool_out_hbm
    pool_out_hbm,  # [P, S, C, Dp] HBM
    sem,  # DMA semaphore
):
    del pool_in_hbm  # Same buffer as pool_out_hbm.
    num_tokens = new_kv_hbm.shape[0]
    num_pages, page_size = pool_out_hbm.shape[:2]

    def copy(token):
        slot = slots_ref[token]
        in_range = (slot >= 0) & (slot < num_pages * page_size)
        slot = jnp.where(in_range, slot, 0)
        row = pltpu.make_async_copy(
            new_kv_hbm.at[token], pool_out_hbm.at[slot // page_size, slot % page_size], sem
        )
        return in_range, row

    def start(token, carry):
        in_range, row = copy(token)
        pl.when(in_range)(row.start)
        return carry

    def wait(token, carry):
        in_range, row = copy(token)
        pl.when(in_range)(row.wait)
        return carry

    # All rows in flight at once, then drain: the DMA engine overlaps them.
    jax.lax.fori_loop(0, num_tokens, start, 0)
    jax.lax.fori_loop(0, num_tokens, wait, 0)


@functools.partial(jax.jit, static_argnames=("interpret",))
def _update_kv_cache(kv_pages, new_k, new_v, slot_mapping, *, interpret):
    _, _, num_rows, head_dim_padded = kv_pages.shape
    new_kv = interleave_kv(
        new_k.astype(kv_pages.dtype),
        new_v.astype(kv_pages.dtype),
        num_rows=num_rows,
        head_dim_padded=head_dim_padded,
    )  # [T, C, Dp]
    row_bytes = num_rows * head_dim_padded * kv_pages.dtype.itemsize
    num_tokens = new_kv.shape[0]
    return pl.pallas_call(
        _update_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(1,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA(())],
        ),
        out_shape=jax.ShapeDtypeStruct(kv_pages.shape, kv_pages.dtype),
        input_output_aliases={2: 0},  # (slots, new_kv, kv_pages) -> kv_pages
        cost_estimate=pl.CostEstimate(
            flops=0, transcendentals=0, bytes_accessed=2 * num_tokens * row_bytes + 4 * num_tokens
        ),
        interpret=interpret,
        name="kv_cache_update",
    )(slot_mapping, new_kv, kv_pages)


def update_kv_cache_tpu(
    kv_pages: jax.Array,  # [P, S, 2 * Hkv_p, Dp]
    new_k: jax.Array,  # [T, Hkv, D]
    new_v: jax.Array,  # [T, Hkv, D]
    slot_mapping: jax.Array,  # [T] int32, slot = page * page_size + offset
    *,
    interpret=False,
) -> jax.Array:  # [P, S, 2 * Hkv_p, Dp]
    """Writes token t's K/V into slot ``slot_mapping[t]`` of the pool, in place.

    The pool is aliased input -> output, so inside a jitted step with the pool donated only the
    ``T`` written rows move (called eagerly without donation, XLA first copies the pool). Slots
    outside ``[0, P * S)`` are skipped. Several tokens writing one slot (padding tokens sharing a
    page-0 slot) leave one of their rows there.
    """
    if kv_pages.ndim != 4:
        raise ValueError(f"kv_pages must be [P, S, C, Dp], got shape {kv_pages.shape}")
    if kv_pages.dtype not in POOL_DTYPES:
        raise ValueError(f"kv_pages must be float32 or bfloat16, got {kv_pages.dtype}")
    for name, x in (("new_k", new_k), ("new_v", new_v)):
        if x.ndim != 3:
            raise ValueError(f"{name} must be [T, Hkv, D], got shape {x.shape}")
    if new_v.shape != new_k.shape:
        raise ValueError(f"new_v shape {new_v.shape} must match new_k shape {new_k.shape}")
    num_tokens, num_kv_heads, head_dim = new_k.shape
    _, _, num_rows, head_dim_padded = kv_pages.shape
    if 2 * num_kv_heads > num_rows or head_dim > head_dim_padded:
        raise ValueError(
            f"new_k heads/head_dim {new_k.shape[1:]} do not fit kv_pages rows/lanes "
            f"{(num_rows, head_dim_padded)}"
        )
    if slot_mapping.shape != (num_tokens,) or slot_mapping.dtype != jnp.int32:
        raise ValueError(
            f"slot_mapping must be int32 [{num_tokens}], got {slot_mapping.dtype} "
            f"{slot_mapping.shape}"
        )
    return _update_kv_cache(kv_pages, new_k, new_v, slot_mapping, interpret=interpret)
