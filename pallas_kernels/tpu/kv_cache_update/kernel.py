"""A Pallas TPU kernel that writes a step's new K/V rows into their slots of the pool, in place
(the pool layout: ``kv_pool.layout``); the row DMAs and argument checks the 8-bit pool's update
(``quantized``) shares.

Page 0 is the engine's scratch page: padding tokens' slots point into it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.tpu.kv_pool.layout import POOL_DTYPES, interleave_kv


def page_and_offset(slots_ref, token, num_pages: int, page_size: int):
    """``(in_range, page, offset)`` of token ``token``'s slot (page 0's first slot when the slot
    is outside ``[0, P * S)``)."""
    slot = slots_ref[token]
    in_range = (slot >= 0) & (slot < num_pages * page_size)
    slot = jnp.where(in_range, slot, 0)
    return in_range, slot // page_size, slot % page_size


def row_copies(slots_ref, rows_hbm, pool_hbm, semaphore):
    """``(start, wait)``: loops that start, then wait for, one HBM-to-HBM DMA per token, row
    ``rows_hbm[t]`` ([T, C, Dp]) into slot ``slots_ref[t]`` of ``pool_hbm`` ([P, S, C, Dp]);
    slots outside ``[0, P * S)`` are skipped. Every row is in flight before the first wait: the
    DMA engine overlaps them."""
    num_tokens = rows_hbm.shape[0]
    num_pages, page_size = pool_hbm.shape[:2]

    def copy(token):
        in_range, page, offset = page_and_offset(slots_ref, token, num_pages, page_size)
        return in_range, pltpu.make_async_copy(
            rows_hbm.at[token], pool_hbm.at[page, offset], semaphore
        )

    def start(token, carry):
        in_range, row = copy(token)
        pl.when(in_range)(row.start)
        return carry

    def wait(token, carry):
        in_range, row = copy(token)
        pl.when(in_range)(row.wait)
        return carry

    def loop(body):
        return lambda: jax.lax.fori_loop(0, num_tokens, body, 0)

    return loop(start), loop(wait)


def check_update_args(pool_shape, new_k, new_v, slot_mapping, *, pool_name: str) -> None:
    """A ``ValueError`` for new K/V rows ([T, Hkv, D] each) or a ``slot_mapping`` ([T] int32)
    that cannot be written into a pool of ``pool_shape`` ([P, S, C, Dp])."""
    for name, x in (("new_k", new_k), ("new_v", new_v)):
        if x.ndim != 3:
            raise ValueError(f"{name} must be [T, Hkv, D], got shape {x.shape}")
    if new_v.shape != new_k.shape:
        raise ValueError(f"new_v shape {new_v.shape} must match new_k shape {new_k.shape}")
    num_tokens, num_kv_heads, head_dim = new_k.shape
    _, _, num_rows, head_dim_padded = pool_shape
    if 2 * num_kv_heads > num_rows or head_dim > head_dim_padded:
        raise ValueError(
            f"new_k heads/head_dim {new_k.shape[1:]} do not fit {pool_name} rows/lanes "
            f"{(num_rows, head_dim_padded)}"
        )
    if slot_mapping.shape != (num_tokens,) or slot_mapping.dtype != jnp.int32:
        raise ValueError(
            f"slot_mapping must be int32 [{num_tokens}], got {slot_mapping.dtype} "
            f"{slot_mapping.shape}"
        )


def _update_kernel(
    slots_ref,  # [T] SMEM: slot = page * page_size + offset
    new_kv_hbm,  # [T, C, Dp] HBM
    pool_in_hbm,  # [P, S, C, Dp] HBM, aliased with pool_out_hbm
    pool_out_hbm,  # [P, S, C, Dp] HBM
    sem,  # DMA semaphore
):
    del pool_in_hbm  # Same buffer as pool_out_hbm.
    start, wait = row_copies(slots_ref, new_kv_hbm, pool_out_hbm, sem)
    start()
    wait()


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
    check_update_args(kv_pages.shape, new_k, new_v, slot_mapping, pool_name="kv_pages")
    return _update_kv_cache(kv_pages, new_k, new_v, slot_mapping, interpret=interpret)
