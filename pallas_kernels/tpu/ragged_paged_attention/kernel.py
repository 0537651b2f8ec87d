"""Ragged paged attention as a Mosaic TPU kernel: mixed decode rows and prefill chunks in one call.

  q:            [T, Hq, D], tokens of sequence s at rows cu_q_lens[s]:cu_q_lens[s+1]
  kv_pages:     [P, S, 2 * Hkv_p, Dp], the layer's pool (see ``kv_pool.layout``), already holding
                this step's K/V; or a ``QuantizedKVPool`` (8-bit codes and scales)
  kv_lens:      [max_seqs] tokens cached for sequence s, the chunk included; query j of sequence s
                sits at position kv_lens[s] - q_len[s] + j and attends to keys at positions <= it
  block_tables: [max_seqs, pages_per_seq]; cu_q_lens: [max_seqs + 1]; num_seqs: [1]

Design. The grid runs over blocks of ``block_q`` tokens; q and out blocks ``[block_q, Hq, Dp]``
are pipelined by BlockSpecs in their native layout (only padded when D < Dp or T % block_q != 0).
Each KV head's queries are viewed as one ``[rows, Dp]`` matrix, ``rows = block_q * G`` (row =
token * G + group member). The walk over (sequence, KV block) pairs, the double-buffered page DMAs
and the online softmax are ``walk``'s. One kernel body and one ``pallas_call`` serve both pools:
what differs (the pool's arrays and VMEM buffers, its page DMAs, each head's scores and weighted
values) is the pool's part, :class:`FloatPool` here and ``quantized.EightBitPool``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.tpu.kv_pool.quantized import QuantizedKVPool
from pallas_kernels.tpu.ragged_paged_attention.quantized import EightBitPool
from pallas_kernels.tpu.ragged_paged_attention.sizes import (
    attention_cost,
    default_block_sizes,
    vmem_limit,
)
from pallas_kernels.tpu.ragged_paged_attention.validation import validate_arrays, validate_options
from pallas_kernels.tpu.ragged_paged_attention.walk import (
    reset_softmax,
    update_softmax,
    walk_kv_blocks,
    write_output,
)
from pallas_kernels.tpu.tiling import LANES, cdiv


@dataclasses.dataclass(frozen=True)
class CallOptions:
    """The static choices of one call (a static argument of the jitted ``pallas_call``)."""

    scale: float
    soft_cap: float | None
    sliding_window: int | None
    num_kv_heads: int
    pages_per_block: int | None  # KV pages per block (None: ``default_block_sizes``)
    block_q: int | None  # tokens per query block (None: ``default_block_sizes``)
    vmem_limit_bytes: int | None
    interpret: Any  # False, or ``pltpu.InterpretParams``


@dataclasses.dataclass(frozen=True)
class FloatPool:
    """The float pool's part of the kernel: one array, whose K and V rows are multiplied as
    they are."""

    name: ClassVar[str] = "ragged_paged_attention"
    num_arrays: ClassVar[int] = 1
    pinned_to_hbm: ClassVar[bool] = False  # XLA leaves a float pool in HBM by itself

    def scratch_shapes(self, kv_pages, pages_per_block: int) -> list:
        """The double-buffered KV slab ``[2, n, S, C, Dp]`` and its DMA semaphores."""
        _, page_size, num_rows, head_dim_padded = kv_pages.shape
        shape = (2, pages_per_block, page_size, num_rows, head_dim_padded)
        return [pltpu.VMEM(shape, kv_pages.dtype), pltpu.SemaphoreType.DMA((2,))]

    def slab_bytes(self, kv_pages, pages_per_block: int) -> int:
        """VMEM of one slot of the slab."""
        _, page_size, num_rows, head_dim_padded = kv_pages.shape
        return pages_per_block * page_size * num_rows * head_dim_padded * kv_pages.dtype.itemsize

    def score_temporaries(self) -> int:
        """``[rows, block_k]`` float32 temporaries per head beyond scores, probs and mask."""
        return 1

    def cost_terms(self, kv_pages) -> dict:
        return {}

    def page_copies(self, hbm_refs, scratch, page_id, slot, i) -> list:
        (kv_hbm_ref,), (kv_buf, sems) = hbm_refs, scratch
        return [pltpu.make_async_copy(kv_hbm_ref.at[page_id], kv_buf.at[slot, i], sems.at[slot])]

    def head_step(self, scratch, slot, live_keys, *, rows: int, block_k: int):
        """``step(head, q)`` -> (scores [rows, block_k] float32, weighted_values) of one KV head
        over the slab in ``slot``; ``q`` [rows, Dp]."""
        kv_buf = scratch[0]
        head_dim_padded = kv_buf.shape[-1]
        # Keys past live_keys may be unfetched (stale VMEM): zero V so 0 * garbage cannot be NaN.
        key_live = lax.broadcasted_iota(jnp.int32, (block_k, 1), 0) < live_keys

        def step(head, q):
            k = kv_buf[slot, :, :, 2 * head, :].reshape(block_k, head_dim_padded)  # [block_k, Dp]
            v = kv_buf[slot, :, :, 2 * head + 1, :].reshape(block_k, head_dim_padded)
            v = jnp.where(key_live, v.astype(jnp.float32), 0.0).astype(v.dtype)
            scores = lax.dot_general(
                q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
            )  # [rows, block_k]

            def weighted_values(probs):
                return jnp.dot(probs.astype(v.dtype), v, preferred_element_type=jnp.float32)

            return scores, weighted_values

        return step


def _attention_kernel(
    # Scalar prefetch (SMEM).
    kv_lens_ref,  # [max_seqs]
    block_tables_ref,  # [max_seqs * pages_per_seq], flattened
    cu_q_lens_ref,  # [max_seqs + 1]
    num_seqs_ref,  # [1]
    # Inputs.
    q_ref,  # [block_q, Hq, Dp]
    # Then the pool's arrays in HBM; the output [block_q, Hq, Dp]; the pool's VMEM buffers and
    # semaphores; and m, l [Hkv, rows, 128] (running max and sum, lane-broadcast) and acc
    # [Hkv, rows, Dp] (the unnormalised output), all float32.
    *refs,
    pool,
    group: int,
    block_q: int,
    pages_per_seq: int,
    scale: float,
    soft_cap: float | None,
    sliding_window: int | None,
):
    hbm_refs, out_ref = refs[: pool.num_arrays], refs[pool.num_arrays]
    scratch, (m_ref, l_ref, acc_ref) = refs[pool.num_arrays + 1 : -3], refs[-3:]
    num_kv_heads, rows, head_dim_padded = acc_ref.shape
    _, pages_per_block, page_size, _, _ = scratch[0].shape
    block_k = pages_per_block * page_size
    reset_softmax(m_ref, l_ref, acc_ref)

    def page_copies(page_id, slot, i):
        return pool.page_copies(hbm_refs, scratch, page_id, slot, i)

    def attend(slot, mask, live_keys):
        head_step = pool.head_step(scratch, slot, live_keys, rows=rows, block_k=block_k)
        for head in range(num_kv_heads):
            q = q_ref[:, head * group : (head + 1) * group, :].reshape(rows, head_dim_padded)
            scores, weighted_values = head_step(head, q)
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
        num_pages=hbm_refs[0].shape[0],
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


@functools.partial(jax.jit, static_argnames=("pool", "options"))
def _ragged_paged_attention(
    q,  # [T, Hq, D]
    pool_arrays: tuple,  # the pool's arrays (``pool.arrays``)
    kv_lens,  # [max_seqs] int32
    block_tables,  # [max_seqs, pages_per_seq] int32
    cu_q_lens,  # [max_seqs + 1] int32
    num_seqs,  # [1] int32
    *,
    pool,
    options: CallOptions,
):  # [T, Hq, D]
    """The ``pallas_call`` of either pool (arguments checked by ``ragged_paged_attention_tpu``)."""
    num_tokens, num_q_heads, head_dim = q.shape
    kv_pages = pool_arrays[0]
    _, page_size, num_rows, head_dim_padded = kv_pages.shape
    max_seqs, pages_per_seq = block_tables.shape
    num_kv_heads, block_q = options.num_kv_heads, options.block_q
    pages_per_block = options.pages_per_block
    group = num_q_heads // num_kv_heads
    padded_tokens = cdiv(num_tokens, block_q) * block_q
    rows = block_q * group
    block_k = pages_per_block * page_size

    q_padded = jnp.pad(
        q, ((0, padded_tokens - num_tokens), (0, 0), (0, head_dim_padded - head_dim))
    )  # [T_pad, Hq, Dp], no copy when nothing is padded

    vmem_bytes = (
        2 * pool.slab_bytes(kv_pages, pages_per_block)  # the pool's slab, double-buffered
        + 4 * block_q * num_q_heads * head_dim_padded * q.dtype.itemsize  # q and out, 2 buffers
        + num_kv_heads * rows * (head_dim_padded + 2 * LANES) * 4  # acc, m, l
        + (3 + pool.score_temporaries()) * rows * block_k * 4  # scores, probs, mask, the pool's
        + 4 * block_k * head_dim_padded * 4  # K/V head temporaries
    )
    kernel = functools.partial(
        _attention_kernel,
        pool=pool,
        group=group,
        block_q=block_q,
        pages_per_seq=pages_per_seq,
        scale=float(options.scale),
        soft_cap=None if options.soft_cap is None else float(options.soft_cap),
        sliding_window=options.sliding_window,
    )
    q_spec = pl.BlockSpec((block_q, num_q_heads, head_dim_padded), lambda i, *_: (i, 0, 0))
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    if pool.pinned_to_hbm and not options.interpret:
        # Pinned to HBM: else XLA may stage a pool small enough for VMEM through it.
        pool_arrays = tuple(pltpu.with_memory_space_constraint(x, pltpu.HBM) for x in pool_arrays)
    out = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4,
            grid=(padded_tokens // block_q,),
            in_specs=[q_spec] + [any_spec] * pool.num_arrays,
            out_specs=q_spec,
            scratch_shapes=pool.scratch_shapes(kv_pages, pages_per_block)
            + [
                pltpu.VMEM((num_kv_heads, rows, LANES), jnp.float32),
                pltpu.VMEM((num_kv_heads, rows, LANES), jnp.float32),
                pltpu.VMEM((num_kv_heads, rows, head_dim_padded), jnp.float32),
            ],
        ),
        out_shape=jax.ShapeDtypeStruct(q_padded.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel",),
            vmem_limit_bytes=vmem_limit(vmem_bytes, options.vmem_limit_bytes),
        ),
        cost_estimate=attention_cost(
            num_tokens,
            num_q_heads,
            head_dim,
            kv_pages.shape,
            q.dtype.itemsize,
            max_seqs,
            pages_per_seq,
            **pool.cost_terms(kv_pages),
        ),
        interpret=options.interpret,
        name=pool.name,
    )(kv_lens, block_tables.reshape(-1), cu_q_lens, num_seqs, q_padded, *pool_arrays)
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
    exceeds 3/4 of the 16 MiB scoped default. An 8-bit pool (``QuantizedKVPool``) is read by
    ``quantized.EightBitPool`` (codes and scales DMA'd, scales applied to scores and
    probabilities); its page_size must fill int8's 32-row tiles.
    """
    if isinstance(kv_pages, QuantizedKVPool):
        codes, kv_scales = kv_pages.codes, kv_pages.scales
        pool, pool_arrays = EightBitPool(head_dim=q.shape[-1]), (codes, kv_scales)
    else:
        codes, kv_scales = kv_pages, None
        pool, pool_arrays = FloatPool(), (kv_pages,)
    metadata = (kv_lens, block_tables, cu_q_lens, num_seqs)
    options = CallOptions(
        scale=scale,
        soft_cap=soft_cap,
        sliding_window=sliding_window,
        num_kv_heads=validate_arrays(q, codes, kv_scales, metadata, num_kv_heads),
        pages_per_block=num_kv_pages_per_block,
        block_q=num_queries_per_block,
        vmem_limit_bytes=vmem_limit_bytes,
        interpret=interpret,
    )
    max_seqs, pages_per_seq = block_tables.shape
    validate_options(options, pages_per_seq)
    num_tokens, num_q_heads, _ = q.shape
    _, page_size, num_rows, head_dim_padded = codes.shape
    pages, block_q = default_block_sizes(
        num_tokens,
        max_seqs,
        num_q_heads // options.num_kv_heads,
        page_size,
        pages_per_seq,
        page_size * num_rows * head_dim_padded * codes.dtype.itemsize,
    )
    options = dataclasses.replace(
        options,
        scale=float(scale),
        pages_per_block=options.pages_per_block or pages,
        block_q=options.block_q or block_q,
    )
    return _ragged_paged_attention(q, pool_arrays, *metadata, pool=pool, options=options)
