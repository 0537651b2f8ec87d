"""Ragged paged attention on an 8-bit pool (``QuantizedKVPool``: int8 / fp8 codes and lane-major
bfloat16 scales), as a Mosaic TPU kernel.

The codes are never dequantised. Each page's codes and its ``[C * G, S]`` scales are DMA'd into
VMEM (the scales into lanes ``i * S .. (i + 1) * S`` of a ``[C * G, block_k]`` slab, so each
row's scales of a KV block are one lane-dense ``[1, block_k]`` row), and the scales are applied
where they are per key:

  scores[r, t] = sum_g (q[r, group g lanes] . k_codes[t, group g lanes]) * k_scale[g, t]
  out[r, d]    = sum_t (p[r, t] * v_scale[g(d), t]) * v_codes[t, d]

i.e. G masked dots per head for K (lanes of other groups zeroed in q) and G dots for V (the
scaled probabilities, keeping the output lanes of group g). G is 4 at D = 128; one dot each when
G = 1. Codes are exact in q's dtype (int8 and e4m3 both fit bfloat16). The walk over sequences,
KV blocks, DMAs and the online softmax is ``ragged_paged_attention_walk``'s.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.tpu.kv_cache_update import LANES
from pallas_kernels.tpu.kv_pool_quantized import (
    SCALE_TILE_ROWS,
    scale_bytes_per_page,
    scale_groups,
    scale_rows,
    scale_vmem_bytes_per_page,
)
from pallas_kernels.tpu.ragged_paged_attention_sizes import attention_cost, cdiv, vmem_limit
from pallas_kernels.tpu.ragged_paged_attention_walk import (
    reset_softmax,
    update_softmax,
    walk_kv_blocks,
    write_output,
)


def _quantized_attention_kernel(
    # Scalar prefetch (SMEM).
    kv_lens_ref,  # [max_seqs]
    block_tables_ref,  # [max_seqs * pages_per_seq], flattened
    cu_q_lens_ref,  # [max_seqs + 1]
    num_seqs_ref,  # [1]
    # Inputs.
    q_ref,  # [block_q, Hq, Dp]
    codes_hbm_ref,  # [P, S, C, Dp] int8 / fp8, HBM
    scales_hbm_ref,  # [P, C * G, S] float32, HBM
    # Output.
    out_ref,  # [block_q, Hq, Dp]
    # Scratch.
    codes_buf,  # [2, n, S, C, Dp] double-buffered codes slab
    code_sems,  # DMA [2]
    scale_buf,  # [2, C * G, n * S] double-buffered scales slab, lane-major
    scale_sems,  # DMA [2]
    m_ref,  # [Hkv, rows, 128] f32
    l_ref,  # [Hkv, rows, 128] f32
    acc_ref,  # [Hkv, rows, Dp] f32
    *,
    group: int,
    block_q: int,
    pages_per_seq: int,
    scale: float,
    soft_cap: float | None,
    sliding_window: int | None,
    head_dim: int,
):
    num_kv_heads, rows, head_dim_padded = acc_ref.shape
    _, pages_per_block, page_size, _, _ = codes_buf.shape
    block_k = pages_per_block * page_size
    groups = scale_groups(head_dim)
    reset_softmax(m_ref, l_ref, acc_ref)

    def page_copies(page_id, slot, i):
        codes = pltpu.make_async_copy(
            codes_hbm_ref.at[page_id], codes_buf.at[slot, i], code_sems.at[slot]
        )
        scales = pltpu.make_async_copy(
            scales_hbm_ref.at[page_id],
            scale_buf.at[slot, :, pl.ds(i * page_size, page_size)],
            scale_sems.at[slot],
        )
        return [codes, scales]

    # Full [rows, Dp] so the mask needs no sublane broadcast (Mosaic has none for booleans).
    lane_group = lax.broadcasted_iota(jnp.int32, (rows, head_dim_padded), 1) // (head_dim // groups)

    num_scale_rows = scale_buf.shape[1]

    def scales_of(slot, row, g):  # [1, block_k]: row ``row``'s group-g scale of every key
        # Picked out of its aligned 16-row bfloat16 tile by a masked sum in float32: Mosaic
        # cannot broadcast a row loaded at a sublane offset.
        index = row * groups + g
        base = index // SCALE_TILE_ROWS * SCALE_TILE_ROWS
        tile = scale_buf[slot, base : min(base + SCALE_TILE_ROWS, num_scale_rows), :]
        tile = tile.astype(jnp.float32)  # [<= 16, block_k]
        pick = lax.broadcasted_iota(jnp.int32, tile.shape, 0) == index - base
        return jnp.sum(jnp.where(pick, tile, 0.0), axis=0, keepdims=True)

    def in_group(x, g):  # lanes of group g kept, others zero (selected in float32: Mosaic
        # has no bfloat16-layout booleans)
        if groups == 1:
            return x
        return jnp.where(lane_group == g, x.astype(jnp.float32), 0.0).astype(x.dtype)

    def attend(slot, mask, live_keys):
        # Keys past live_keys may be unfetched (stale VMEM): zero their V codes and scales so
        # 0 * garbage cannot be NaN.
        key_row = lax.broadcasted_iota(jnp.int32, (1, block_k), 1) < live_keys  # [1, block_k]
        key_col = lax.broadcasted_iota(jnp.int32, (block_k, 1), 0) < live_keys  # [block_k, 1]
        for head in range(num_kv_heads):
            q = q_ref[:, head * group : (head + 1) * group, :].reshape(rows, head_dim_padded)
            k = codes_buf[slot, :, :, 2 * head, :].reshape(block_k, head_dim_padded)
            k = k.astype(jnp.float32).astype(q.dtype)
            v = codes_buf[slot, :, :, 2 * head + 1, :].reshape(block_k, head_dim_padded)
            v = jnp.where(key_col, v.astype(jnp.float32), 0.0).astype(q.dtype)
            scores = None
            for g in range(groups):
                partial = lax.dot_general(
                    in_group(q, g), k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
                )  # [rows, block_k]
                partial = partial * scales_of(slot, 2 * head, g)
                scores = partial if scores is None else scores + partial

            def weighted_values(probs, head=head, v=v):
                out = None
                for g in range(groups):
                    v_scales = jnp.where(key_row, scales_of(slot, 2 * head + 1, g), 0.0)
                    part = jnp.dot(
                        (probs * v_scales).astype(v.dtype), v, preferred_element_type=jnp.float32
                    )  # [rows, Dp]
                    part = in_group(part, g)
                    out = part if out is None else out + part
                return out

            update_softmax(
                m_ref,
                l_ref,
                acc_ref,
                head,
                scores,
                mask,
                weighted_values,
                scale=scale,
                soft_cap=soft_cap,
            )

    walk_kv_blocks(
        kv_lens_ref,
        block_tables_ref,
        cu_q_lens_ref,
        num_seqs_ref,
        num_pages=codes_hbm_ref.shape[0],
        page_size=page_size,
        pages_per_block=pages_per_block,
        pages_per_seq=pages_per_seq,
        block_q=block_q,
        group=group,
        sliding_window=sliding_window,
        page_copies=page_copies,
        attend=attend,
    )
    write_output(out_ref, l_ref, acc_ref, group=group)


@functools.partial(
    jax.jit,
    static_argnames=(
        "scale",
        "soft_cap",
        "sliding_window",
        "num_kv_heads",
        "pages_per_block",
        "block_q",
        "vmem_limit_bytes",
        "interpret",
    ),
)
def ragged_paged_attention_quantized(
    q,  # [T, Hq, D]
    codes,  # [P, S, C, Dp] int8 / fp8
    scales,  # [P, C * G, S] bfloat16
    kv_lens,  # [max_seqs] int32
    block_tables,  # [max_seqs, pages_per_seq] int32
    cu_q_lens,  # [max_seqs + 1] int32
    num_seqs,  # [1] int32
    *,
    scale,
    soft_cap,
    sliding_window,
    num_kv_heads,
    pages_per_block,
    block_q,
    vmem_limit_bytes,
    interpret,
):  # [T, Hq, D]
    """The 8-bit pool's ``pallas_call`` (arguments checked by ``ragged_paged_attention_tpu``)."""
    num_tokens, num_q_heads, head_dim = q.shape
    _, page_size, num_rows, head_dim_padded = codes.shape
    max_seqs, pages_per_seq = block_tables.shape
    group = num_q_heads // num_kv_heads
    padded_tokens = cdiv(num_tokens, block_q) * block_q
    rows = block_q * group
    block_k = pages_per_block * page_size
    num_scale_rows = scale_rows(num_rows, head_dim)

    q_padded = jnp.pad(
        q, ((0, padded_tokens - num_tokens), (0, 0), (0, head_dim_padded - head_dim))
    )  # [T_pad, Hq, Dp], no copy when nothing is padded

    slab_bytes = block_k * num_rows * head_dim_padded * codes.dtype.itemsize
    slab_bytes += pages_per_block * scale_vmem_bytes_per_page(num_rows, head_dim, page_size)
    vmem_bytes = (
        2 * slab_bytes  # codes and scales, double-buffered
        + 4 * block_q * num_q_heads * head_dim_padded * q.dtype.itemsize  # q and out, 2 buffers
        + num_kv_heads * rows * (head_dim_padded + 2 * LANES) * 4  # acc, m, l
        # scores, probs, mask, and per group a partial score and scaled probabilities
        + (3 + 2 * scale_groups(head_dim)) * rows * block_k * 4
        + 4 * block_k * head_dim_padded * 4  # K/V head temporaries
    )
    kernel = functools.partial(
        _quantized_attention_kernel,
        group=group,
        block_q=block_q,
        pages_per_seq=pages_per_seq,
        scale=float(scale),
        soft_cap=None if soft_cap is None else float(soft_cap),
        sliding_window=sliding_window,
        head_dim=head_dim,
    )
    q_spec = pl.BlockSpec((block_q, num_q_heads, head_dim_padded), lambda i, *_: (i, 0, 0))
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    out = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4,
            grid=(padded_tokens // block_q,),
            in_specs=[q_spec, any_spec, any_spec],
            out_specs=q_spec,
            scratch_shapes=[
                pltpu.VMEM((2, pages_per_block, page_size, num_rows, head_dim_padded), codes.dtype),
                pltpu.SemaphoreType.DMA((2,)),
                pltpu.VMEM((2, num_scale_rows, block_k), scales.dtype),
                pltpu.SemaphoreType.DMA((2,)),
                pltpu.VMEM((num_kv_heads, rows, LANES), jnp.float32),
                pltpu.VMEM((num_kv_heads, rows, LANES), jnp.float32),
                pltpu.VMEM((num_kv_heads, rows, head_dim_padded), jnp.float32),
            ],
        ),
        out_shape=jax.ShapeDtypeStruct(q_padded.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel",),
            vmem_limit_bytes=vmem_limit(vmem_bytes, vmem_limit_bytes),
        ),
        cost_estimate=attention_cost(
            num_tokens,
            num_q_heads,
            head_dim,
            codes.shape,
            q.dtype.itemsize,
            max_seqs,
            pages_per_seq,
            kv_itemsize=codes.dtype.itemsize,
            scale_bytes_per_page=scale_bytes_per_page(num_rows, head_dim, page_size),
            dot_passes=scale_groups(head_dim),
        ),
        interpret=interpret,
        name="ragged_paged_attention_quantized",
    )(
        kv_lens,
        block_tables.reshape(-1),
        cu_q_lens,
        num_seqs,
        q_padded,
        # Pinned to HBM: else XLA may stage a pool small enough for VMEM through it.
        *(
            x if interpret else pltpu.with_memory_space_constraint(x, pltpu.HBM)
            for x in (codes, scales)
        ),
    )
    return out[:num_tokens, :, :head_dim]
