"""Ragged paged attention as a Mosaic TPU kernel: mixed decode rows and prefill chunks in one call.

  q:            [T, Hq, D], tokens of sequence s at rows cu_q_lens[s]:cu_q_lens[s+1]
  kv_pages:     [P, S, 2 * Hkv_p, Dp], the layer's pool (see ``kv_cache_update``), already holding
                this step's K/V
  kv_lens:      [max_seqs] tokens cached for sequence s, the chunk included; query j of sequence s
                sits at position kv_lens[s] - q_len[s] + j and attends to keys at positions <= it
  block_tables: [max_seqs, pages_per_seq]; cu_q_lens: [max_seqs + 1]; num_seqs: [1]

Design. The grid runs over blocks of ``block_q`` tokens; q and out blocks ``[block_q, Hq, Dp]``
are pipelined by BlockSpecs in their native layout (only padded when D < Dp or T % block_q != 0).
Each KV head's queries are viewed as one ``[rows, Dp]`` matrix, ``rows = block_q * G`` (row =
token * G + group member). The walk over (sequence, KV block) pairs, the double-buffered page DMAs
and the online softmax are ``ragged_paged_attention_walk``'s; this file holds the float pool's
per-head step, its ``pallas_call`` and the public entry point, which sends an 8-bit pool to
``ragged_paged_attention_quantized``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.tpu.kv_cache_update import LANES
from pallas_kernels.tpu.kv_pool_quantized import QuantizedKVPool
from pallas_kernels.tpu.ragged_paged_attention_quantized import ragged_paged_attention_quantized
from pallas_kernels.tpu.ragged_paged_attention_sizes import (
    attention_cost,
    cdiv,
    default_block_sizes,
    vmem_limit,
)
from pallas_kernels.tpu.ragged_paged_attention_validation import validate_attention_call
from pallas_kernels.tpu.ragged_paged_attention_walk import (
    reset_softmax,
    update_softmax,
    walk_kv_blocks,
    write_output,
)


def _attention_kernel(
    # Scalar prefetch (SMEM).
    kv_lens_ref,  # [max_seqs]
    block_tables_ref,  # [max_seqs * pages_per_seq], flattened
    cu_q_lens_ref,  # [max_seqs + 1]
    num_seqs_ref,  # [1]
    # Inputs.
    q_ref,  # [block_q, Hq, Dp]
    kv_hbm_ref,  # [P, S, C, Dp], HBM
    # Output.
    out_ref,  # [block_q, Hq, Dp]
    # Scratch.
    kv_buf,  # [2, n, S, C, Dp] double-buffered KV slab
    sems,  # DMA [2]
    m_ref,  # [Hkv, rows, 128] f32 running max (lane-broadcast)
    l_ref,  # [Hkv, rows, 128] f32 running sum
    acc_ref,  # [Hkv, rows, Dp] f32 unnormalised output
    *,
    group: int,
    block_q: int,
    pages_per_seq: int,
    scale: float,
    soft_cap: float | None,
    sliding_window: int | None,
):
    num_kv_heads, rows, head_dim = acc_ref.shape
    _, pages_per_block, page_size, _, _ = kv_buf.shape
    block_k = pages_per_block * page_size
    reset_softmax(m_ref, l_ref, acc_ref)

    def page_copies(page_id, slot, i):
        return [pltpu.make_async_copy(kv_hbm_ref.at[page_id], kv_buf.at[slot, i], sems.at[slot])]

    def attend(slot, mask, live_keys):
        # Keys past live_keys may be unfetched (stale VMEM): zero V so 0 * garbage cannot be NaN.
        key_live = lax.broadcasted_iota(jnp.int32, (block_k, 1), 0) < live_keys
        for head in range(num_kv_heads):
            k = kv_buf[slot, :, :, 2 * head, :].reshape(block_k, head_dim)  # [block_k, Dp]
            v = kv_buf[slot, :, :, 2 * head + 1, :].reshape(block_k, head_dim)
            v = jnp.where(key_live, v.astype(jnp.float32), 0.0).astype(v.dtype)
            q = q_ref[:, head * group : (head + 1) * group, :].reshape(rows, head_dim)
            scores = lax.dot_general(
                q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
            )  # [rows, block_k]

            def weighted_values(probs, v=v):
                return jnp.dot(probs.astype(v.dtype), v, preferred_element_type=jnp.float32)

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
        num_pages=kv_hbm_ref.shape[0],
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
def _ragged_paged_attention(
    q,
    kv_pages,
    kv_lens,
    block_tables,
    cu_q_lens,
    num_seqs,
    *,
    scale,
    soft_cap,
    sliding_window,
    num_kv_heads,
    pages_per_block,
    block_q,
    vmem_limit_bytes,
    interpret,
):
    num_tokens, num_q_heads, head_dim = q.shape
    _, page_size, num_rows, head_dim_padded = kv_pages.shape
    max_seqs, pages_per_seq = block_tables.shape
    group = num_q_heads // num_kv_heads
    padded_tokens = cdiv(num_tokens, block_q) * block_q
    rows = block_q * group
    itemsize = q.dtype.itemsize

    q_padded = jnp.pad(
        q, ((0, padded_tokens - num_tokens), (0, 0), (0, head_dim_padded - head_dim))
    )  # [T_pad, Hq, Dp], no copy when nothing is padded

    block_k = pages_per_block * page_size
    slab_bytes = pages_per_block * page_size * num_rows * head_dim_padded * kv_pages.dtype.itemsize
    vmem_bytes = (
        2 * slab_bytes  # KV double buffer
        + 4 * block_q * num_q_heads * head_dim_padded * itemsize  # q and out, double-buffered
        + num_kv_heads * rows * (head_dim_padded + 2 * LANES) * 4  # acc, m, l
        + 4 * rows * block_k * 4  # scores, probs, mask temporaries
        + 4 * block_k * head_dim_padded * 4  # K/V head temporaries
    )
    kernel = functools.partial(
        _attention_kernel,
        group=group,
        block_q=block_q,
        pages_per_seq=pages_per_seq,
        scale=float(scale),
        soft_cap=None if soft_cap is None else float(soft_cap),
        sliding_window=sliding_window,
    )
    q_spec = pl.BlockSpec((block_q, num_q_heads, head_dim_padded), lambda i, *_: (i, 0, 0))
    out = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4,
            grid=(padded_tokens // block_q,),
            in_specs=[q_spec, pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=q_spec,
            scratch_shapes=[
                pltpu.VMEM(
                    (2, pages_per_block, page_size, num_rows, head_dim_padded), kv_pages.dtype
                ),
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
            num_tokens, num_q_heads, head_dim, kv_pages.shape, itemsize, max_seqs, pages_per_seq
        ),
        interpret=interpret,
        name="ragged_paged_attention",
    )(kv_lens, block_tables.reshape(-1), cu_q_lens, num_seqs, q_padded, kv_pages)
    return out[:num_tokens, :, :head_dim]


def ragged_paged_attention_tpu(
    q: jax.Array,  # [T, Hq, D]
    kv_pages,  # [P, S, 2 * Hkv_p, Dp] array, or a QuantizedKVPool (8-bit codes + scales)
    kv_lens: jax.Array,  # [max_seqs] int32
    block_tables: jax.Array,  # [max_seqs, pages_per_seq] int32
    cu_q_lens: jax.Array,  # [max_seqs + 1] int32
    num_seqs: jax.Array,  # [1] int32
    *,
    scale: float,
    soft_cap: float | None = None,
    sliding_window: int | None = None,
    num_kv_pages_per_block: int | None = None,
    num_queries_per_block: int | None = None,
    vmem_limit_bytes: int | None = None,
    interpret=False,
    num_kv_heads: int | None = None,
) -> jax.Array:  # [T, Hq, D]
    """Causal attention of each sequence's query rows to its paged K/V (mixed decode/prefill).

    Rows past ``cu_q_lens[num_seqs]`` and rows of empty sequences are zeros. ``num_kv_heads`` is
    only needed when the pool carries padding heads (default: ``kv_pages.shape[2] // 2``). Block
    sizes default to :func:`default_block_sizes`; the VMEM limit is raised only when the estimate
    exceeds 3/4 of the 16 MiB scoped default. An 8-bit pool (``QuantizedKVPool``) goes to
    ``ragged_paged_attention_quantized`` (codes and scales DMA'd, scales applied to scores and
    probabilities); its page_size must fill int8's 32-row tiles.
    """
    kv_scales = None
    if isinstance(kv_pages, QuantizedKVPool):
        kv_pages, kv_scales = kv_pages.codes, kv_pages.scales
    num_kv_heads = validate_attention_call(
        q,
        kv_pages,
        kv_scales,
        kv_lens,
        block_tables,
        cu_q_lens,
        num_seqs,
        scale=scale,
        soft_cap=soft_cap,
        sliding_window=sliding_window,
        num_kv_pages_per_block=num_kv_pages_per_block,
        num_queries_per_block=num_queries_per_block,
        vmem_limit_bytes=vmem_limit_bytes,
        num_kv_heads=num_kv_heads,
    )
    num_tokens, num_q_heads, _ = q.shape
    max_seqs, pages_per_seq = block_tables.shape
    _, page_size, num_rows, head_dim_padded = kv_pages.shape
    pages, block_q = default_block_sizes(
        num_tokens,
        max_seqs,
        num_q_heads // num_kv_heads,
        page_size,
        pages_per_seq,
        page_size * num_rows * head_dim_padded * kv_pages.dtype.itemsize,
    )
    options = dict(
        scale=float(scale),
        soft_cap=soft_cap,
        sliding_window=sliding_window,
        num_kv_heads=num_kv_heads,
        pages_per_block=num_kv_pages_per_block or pages,
        block_q=num_queries_per_block or block_q,
        vmem_limit_bytes=vmem_limit_bytes,
        interpret=interpret,
    )
    metadata = (kv_lens, block_tables, cu_q_lens, num_seqs)
    if kv_scales is not None:
        return ragged_paged_attention_quantized(q, kv_pages, kv_scales, *metadata, **options)
    return _ragged_paged_attention(q, kv_pages, *metadata, **options)
