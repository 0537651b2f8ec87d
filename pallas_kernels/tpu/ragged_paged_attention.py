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
token * G + group member). Within a grid step the
kernel walks every (sequence, KV block) pair the block's tokens need, in order: sequences that own
rows of the block, and for each the KV blocks from the sliding-window start to its last query in
the block. KV blocks of ``num_kv_pages_per_block`` pages are DMA'd page by page from HBM into a
double-buffered VMEM slab; the next pair's DMA is issued before the current pair is computed, also
across sequence boundaries. Pages past the last needed key are not fetched. Every pair updates an
online softmax (f32) for all rows of the block; rows of other sequences are masked out and keep
their state, so no dynamic row slicing is needed. Rows owned by no sequence (padding past
``cu_q_lens[num_seqs]``, empty sequences) output zeros.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.tpu.kv_cache_update import (
    LANES,
    POOL_DTYPES,
    _tile_friendly,
    dtype_packing,
    padded_head_dim,
)
from pallas_kernels.tpu.kv_pool_quantized import QuantizedKVPool, scale_columns, scale_groups
from pallas_kernels.tpu.ragged_paged_attention_sizes import (
    attention_cost,
    cdiv,
    default_block_sizes,
    sublane_rows,
)

CODE_DTYPES = (jnp.dtype(jnp.int8), jnp.dtype(jnp.float8_e4m3fn))
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
VMEM_SCOPED_DEFAULT = 16 * 1024 * 1024  # v5e scoped default; above it we raise the limit.


def _attention_kernel(
    # Scalar prefetch (SMEM).
    kv_lens_ref,  # [max_seqs]
    block_tables_ref,  # [max_seqs * pages_per_seq], flattened
    cu_q_lens_ref,  # [max_seqs + 1]
    num_seqs_ref,  # [1]
    # Inputs: q_ref [block_q, Hq, Dp]; kv_hbm_ref [P, S, C, Dp] in HBM; with an 8-bit pool
    # (``scale_groups``), scales_hbm_ref [P, S, Ls] float32 in HBM.
    # Output: out_ref [block_q, Hq, Dp].
    # Scratch: kv_buf [2, n, S, C, Dp] double-buffered KV slab; sems DMA [2]; with an 8-bit pool
    # scale_buf [2, n, S, Ls] and scale_sems DMA [2]; m_ref / l_ref [Hkv, rows, 128] f32
    # running max / sum (lane-broadcast); acc_ref [Hkv, rows, Dp] f32 unnormalized output.
    *refs,
    group: int,
    block_q: int,
    pages_per_seq: int,
    scale: float,
    soft_cap: float | None,
    sliding_window: int | None,
    scale_groups: int | None = None,
    head_dim_real: int | None = None,
):
    quantized = scale_groups is not None
    if quantized:
        (q_ref, kv_hbm_ref, scales_hbm_ref, out_ref, kv_buf, sems, scale_buf, scale_sems) = refs[:8]
    else:
        (q_ref, kv_hbm_ref, out_ref, kv_buf, sems) = refs[:5]
    m_ref, l_ref, acc_ref = refs[-3:]
    num_kv_heads, rows, head_dim = acc_ref.shape
    _, pages_per_block, page_size, num_rows, _ = kv_buf.shape
    num_pages = kv_hbm_ref.shape[0]
    block_k = pages_per_block * page_size
    max_seqs = kv_lens_ref.shape[0]
    num_seqs = jnp.minimum(num_seqs_ref[0], max_seqs)
    row_start = pl.program_id(0) * block_q  # first token of this block
    row_end = row_start + block_q

    m_ref[...] = jnp.full(m_ref.shape, MASK_VALUE, jnp.float32)
    l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
    acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def seq_extent(seq):
        """Rows of ``seq`` in this block, its key range and its KV block range."""
        q_begin = cu_q_lens_ref[seq]
        q_len = cu_q_lens_ref[seq + 1] - q_begin
        kv_len = kv_lens_ref[seq]
        first_row = jnp.maximum(q_begin, row_start)
        last_row = jnp.minimum(q_begin + q_len, row_end) - 1
        first_pos = kv_len - q_len + (first_row - q_begin)
        key_end = jnp.minimum(kv_len, kv_len - q_len + (last_row - q_begin) + 1)
        key_end = jnp.minimum(key_end, pages_per_seq * page_size)
        key_start = 0 if sliding_window is None else jnp.maximum(first_pos - sliding_window + 1, 0)
        block_begin = key_start // block_k
        block_end = jnp.where(last_row >= first_row, cdiv(key_end, block_k), 0)
        return key_end, block_begin, block_end

    def in_block(seq):
        return (seq < num_seqs) & (cu_q_lens_ref[jnp.minimum(seq, max_seqs)] < row_end)

    def skip_idle(seq):
        """First sequence >= ``seq`` with KV blocks to process here (or one past the block)."""

        def idle(seq):
            _, block_begin, block_end = seq_extent(jnp.minimum(seq, max_seqs - 1))
            return in_block(seq) & (block_begin >= block_end)

        return lax.while_loop(idle, lambda s: s + 1, seq)

    def page_copies(seq, kv_block, slot):
        """One DMA per page of the KV block, with whether that page is needed."""
        key_end, _, _ = seq_extent(seq)
        page_end = cdiv(key_end, page_size)
        copies = []
        for i in range(pages_per_block):
            page = kv_block * pages_per_block + i
            needed = page < page_end
            page_id = block_tables_ref[seq * pages_per_seq + jnp.minimum(page, pages_per_seq - 1)]
            page_id = jnp.clip(page_id, 0, num_pages - 1)
            copy = pltpu.make_async_copy(kv_hbm_ref.at[page_id], kv_buf.at[slot, i], sems.at[slot])
            copies.append((needed, copy))
            if quantized:  # the page's scales beside its codes
                scales = pltpu.make_async_copy(
                    scales_hbm_ref.at[page_id], scale_buf.at[slot, i], scale_sems.at[slot]
                )
                copies.append((needed, scales))
        return copies

    def start_fetch(seq, kv_block, slot):
        for needed, copy in page_copies(seq, kv_block, slot):
            pl.when(needed)(copy.start)

    def wait_fetch(seq, kv_block, slot):
        for needed, copy in page_copies(seq, kv_block, slot):
            pl.when(needed)(copy.wait)

    def dequantize(slot, row):
        """Row ``row`` of the 8-bit slab as q's dtype: codes times their 32-lane group's scale
        ([block_k, Dp]), in VMEM."""
        codes = kv_buf[slot, :, :, row, :].reshape(block_k, head_dim).astype(jnp.float32)
        scales = scale_buf[slot, :, :, row * scale_groups : (row + 1) * scale_groups]
        scales = scales.reshape(block_k, scale_groups)  # [block_k, G]
        lane_group = lax.broadcasted_iota(jnp.int32, (1, head_dim), 1) // (
            head_dim_real // scale_groups
        )
        full = scales[:, :1]
        for g in range(1, scale_groups):
            full = jnp.where(lane_group == g, scales[:, g : g + 1], full)  # [block_k, Dp]
        return (codes * full).astype(q_ref.dtype)

    def load_head(slot, head):
        """K and V of one head from the slab: 2 x [block_k, Dp] (sublane-indexed loads)."""
        if quantized:
            return dequantize(slot, 2 * head), dequantize(slot, 2 * head + 1)
        k = kv_buf[slot, :, :, 2 * head, :].reshape(block_k, head_dim)
        v = kv_buf[slot, :, :, 2 * head + 1, :].reshape(block_k, head_dim)
        return k, v

    def compute(seq, kv_block, slot):
        q_begin = cu_q_lens_ref[seq]
        q_len = cu_q_lens_ref[seq + 1] - q_begin
        kv_len = kv_lens_ref[seq]
        key_end, _, _ = seq_extent(seq)
        token = row_start + lax.broadcasted_iota(jnp.int32, (rows, 1), 0) // group  # [rows, 1]
        offset = token - q_begin
        q_pos = kv_len - q_len + offset  # [rows, 1]
        key_pos = kv_block * block_k + lax.broadcasted_iota(jnp.int32, (1, block_k), 1)
        mask = (offset >= 0) & (offset < q_len) & (key_pos <= q_pos)  # [rows, block_k]
        if sliding_window is not None:
            mask &= key_pos > q_pos - sliding_window
        # Keys past key_end may be unfetched (stale VMEM): zero V so 0 * garbage cannot be NaN.
        key_live = lax.broadcasted_iota(jnp.int32, (block_k, 1), 0) < key_end - kv_block * block_k
        for head in range(num_kv_heads):
            k, v = load_head(slot, head)  # [block_k, Dp]
            v = jnp.where(key_live, v.astype(jnp.float32), 0.0).astype(v.dtype)
            q = q_ref[:, head * group : (head + 1) * group, :].reshape(rows, head_dim)
            scores = lax.dot_general(
                q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
            )  # [rows, block_k]
            scores = scores * scale
            if soft_cap is not None:
                scores = soft_cap * jnp.tanh(scores / soft_cap)
            scores = jnp.where(mask, scores, MASK_VALUE)
            m_prev = m_ref[head][:, :1]  # [rows, 1]
            m_next = jnp.maximum(m_prev, jnp.max(scores, axis=1, keepdims=True))
            probs = jnp.where(mask, jnp.exp(scores - m_next), 0.0)  # [rows, block_k]
            alpha = jnp.exp(m_prev - m_next)  # [rows, 1]
            l_next = alpha * l_ref[head][:, :1] + jnp.sum(probs, axis=1, keepdims=True)
            pv = jnp.dot(probs.astype(v.dtype), v, preferred_element_type=jnp.float32)
            acc_ref[head] = alpha * acc_ref[head] + pv
            m_ref[head] = jnp.broadcast_to(m_next, (rows, LANES))
            l_ref[head] = jnp.broadcast_to(l_next, (rows, LANES))

    def next_pair(seq, kv_block):
        _, _, block_end = seq_extent(seq)
        more = kv_block + 1 < block_end
        next_seq = jnp.where(more, seq, skip_idle(seq + 1))
        _, next_begin, _ = seq_extent(jnp.minimum(next_seq, max_seqs - 1))
        return next_seq, jnp.where(more, kv_block + 1, next_begin)

    # Find the first sequence with rows at or after row_start, then the first with work here.
    first_seq = lax.while_loop(
        lambda s: (s < num_seqs) & (cu_q_lens_ref[jnp.minimum(s + 1, max_seqs)] <= row_start),
        lambda s: s + 1,
        jnp.int32(0),
    )
    first_seq = skip_idle(first_seq)
    _, first_block, _ = seq_extent(jnp.minimum(first_seq, max_seqs - 1))

    @pl.when(in_block(first_seq))
    def _():
        start_fetch(first_seq, first_block, 0)

    def body(state):
        seq, kv_block, slot = state
        next_seq, next_block = next_pair(seq, kv_block)

        @pl.when(in_block(next_seq))
        def _():
            start_fetch(next_seq, next_block, 1 - slot)

        wait_fetch(seq, kv_block, slot)
        compute(seq, kv_block, slot)
        return next_seq, next_block, 1 - slot

    lax.while_loop(lambda state: in_block(state[0]), body, (first_seq, first_block, jnp.int32(0)))

    for head in range(num_kv_heads):
        row_sum = l_ref[head][:, :1]
        inverse = jnp.where(row_sum > 0.0, 1.0 / jnp.where(row_sum > 0.0, row_sum, 1.0), 0.0)
        out = (acc_ref[head] * inverse).astype(out_ref.dtype)  # [rows, Dp]
        out_ref[:, head * group : (head + 1) * group, :] = out.reshape(block_q, group, head_dim)


def _validate(
    q,
    kv_pages,
    kv_scales,
    kv_lens,
    block_tables,
    cu_q_lens,
    num_seqs,
    *,
    scale,
    soft_cap,
    sliding_window,
    num_kv_pages_per_block,
    num_queries_per_block,
    vmem_limit_bytes,
    num_kv_heads,
) -> int:
    """Raises ``ValueError`` naming the bad argument; returns the number of real KV heads."""
    if q.ndim != 3:
        raise ValueError(f"q must be [T, Hq, D], got shape {q.shape}")
    if q.dtype not in POOL_DTYPES:
        raise ValueError(f"q must be float32 or bfloat16, got {q.dtype}")
    if kv_pages.ndim != 4:
        raise ValueError(f"kv_pages must be [P, S, 2 * Hkv_p, Dp], got shape {kv_pages.shape}")
    _, num_q_heads, head_dim = q.shape
    if kv_scales is None and kv_pages.dtype != q.dtype:
        raise ValueError(f"kv_pages dtype {kv_pages.dtype} must match q dtype {q.dtype}")
    if kv_scales is not None:
        if kv_pages.dtype not in CODE_DTYPES:
            raise ValueError(f"kv_pages codes must be int8 or float8_e4m3fn, got {kv_pages.dtype}")
        expected = (*kv_pages.shape[:2], scale_columns(kv_pages.shape[2], head_dim))
        if kv_scales.shape != expected or kv_scales.dtype != jnp.float32:
            raise ValueError(
                f"kv_pages scales must be float32 {expected}, got {kv_scales.dtype} "
                f"{kv_scales.shape}"
            )
    _, page_size, num_rows, head_dim_padded = kv_pages.shape
    packing = dtype_packing(kv_pages.dtype)
    if num_rows % 2 or num_rows % packing or not _tile_friendly(num_rows // packing):
        raise ValueError(
            f"kv_pages axis 2 ({num_rows}) must be 2 * Hkv_p with Hkv_p from padded_num_kv_heads"
        )
    if head_dim_padded != padded_head_dim(head_dim):
        raise ValueError(
            f"kv_pages head_dim {head_dim_padded} must be q head_dim {head_dim} padded to "
            f"{padded_head_dim(head_dim)}"
        )
    tile = sublane_rows(kv_pages.dtype)
    if not 16 <= page_size <= 256 or page_size % tile:
        raise ValueError(
            f"kv_pages page_size {page_size} must be in [16, 256] and a multiple of {tile}"
        )
    num_kv_heads = num_rows // 2 if num_kv_heads is None else num_kv_heads
    if not 0 < num_kv_heads <= num_rows // 2:
        raise ValueError(f"num_kv_heads {num_kv_heads} must be in [1, {num_rows // 2}]")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"q heads {num_q_heads} must be a multiple of num_kv_heads {num_kv_heads}")
    for name, x, rank in (
        ("kv_lens", kv_lens, 1),
        ("block_tables", block_tables, 2),
        ("cu_q_lens", cu_q_lens, 1),
        ("num_seqs", num_seqs, 1),
    ):
        if x.ndim != rank or x.dtype != jnp.int32:
            raise ValueError(f"{name} must be int32 of rank {rank}, got {x.dtype} {x.shape}")
    max_seqs, pages_per_seq = block_tables.shape
    if kv_lens.shape[0] != max_seqs:
        raise ValueError(f"block_tables rows {max_seqs} must equal kv_lens length {kv_lens.shape}")
    if cu_q_lens.shape[0] != max_seqs + 1:
        raise ValueError(f"cu_q_lens length {cu_q_lens.shape[0]} must be max_seqs + 1")
    if num_seqs.shape != (1,):
        raise ValueError(f"num_seqs must have shape (1,), got {num_seqs.shape}")
    if max_seqs < 1 or pages_per_seq < 1:
        raise ValueError(f"block_tables must be non-empty, got shape {block_tables.shape}")
    if not isinstance(scale, (int, float)):
        raise ValueError(f"scale must be a Python float, got {type(scale)}")
    if soft_cap is not None and not soft_cap > 0:
        raise ValueError(f"soft_cap must be None or positive, got {soft_cap}")
    if sliding_window is not None and (not isinstance(sliding_window, int) or sliding_window < 1):
        raise ValueError(f"sliding_window must be None or a positive int, got {sliding_window}")
    if num_kv_pages_per_block is not None and not 0 < num_kv_pages_per_block <= pages_per_seq:
        raise ValueError(
            f"num_kv_pages_per_block {num_kv_pages_per_block} must be in [1, {pages_per_seq}]"
        )
    if num_queries_per_block is not None and (
        num_queries_per_block < 8 or num_queries_per_block % 8
    ):
        raise ValueError(
            f"num_queries_per_block {num_queries_per_block} must be a positive multiple of 8"
        )
    if vmem_limit_bytes is not None and vmem_limit_bytes <= 0:
        raise ValueError(f"vmem_limit_bytes must be positive, got {vmem_limit_bytes}")
    return num_kv_heads


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
    kv_scales,
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
    quantized = kv_scales is not None
    groups = scale_groups(head_dim) if quantized else None
    columns = scale_columns(num_rows, head_dim) if quantized else 0

    q_padded = jnp.pad(
        q, ((0, padded_tokens - num_tokens), (0, 0), (0, head_dim_padded - head_dim))
    )  # [T_pad, Hq, Dp], no copy when nothing is padded

    block_k = pages_per_block * page_size
    slab_bytes = pages_per_block * page_size * num_rows * head_dim_padded * kv_pages.dtype.itemsize
    slab_bytes += pages_per_block * page_size * columns * 4
    vmem_bytes = (
        2 * slab_bytes  # KV double buffer
        + 4 * block_q * num_q_heads * head_dim_padded * itemsize  # q and out, double-buffered
        + num_kv_heads * rows * (head_dim_padded + 2 * LANES) * 4  # acc, m, l
        + 4 * rows * block_k * 4  # scores, probs, mask temporaries
        + 4 * block_k * head_dim_padded * 4  # K/V head temporaries
    )
    if vmem_limit_bytes is None and vmem_bytes > VMEM_SCOPED_DEFAULT * 3 // 4:
        vmem_limit_bytes = min(2 * vmem_bytes, 100 * 1024 * 1024)

    kernel = functools.partial(
        _attention_kernel,
        group=group,
        block_q=block_q,
        pages_per_seq=pages_per_seq,
        scale=float(scale),
        soft_cap=None if soft_cap is None else float(soft_cap),
        sliding_window=sliding_window,
        scale_groups=groups,
        head_dim_real=head_dim if quantized else None,
    )
    q_spec = pl.BlockSpec((block_q, num_q_heads, head_dim_padded), lambda i, *_: (i, 0, 0))
    out = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4,
            grid=(padded_tokens // block_q,),
            in_specs=[q_spec] + [pl.BlockSpec(memory_space=pl.ANY)] * (2 if quantized else 1),
            out_specs=q_spec,
            scratch_shapes=[
                pltpu.VMEM(
                    (2, pages_per_block, page_size, num_rows, head_dim_padded), kv_pages.dtype
                ),
                pltpu.SemaphoreType.DMA((2,)),
                *(
                    [
                        pltpu.VMEM((2, pages_per_block, page_size, columns), jnp.float32),
                        pltpu.SemaphoreType.DMA((2,)),
                    ]
                    if quantized
                    else []
                ),
                pltpu.VMEM((num_kv_heads, rows, LANES), jnp.float32),
                pltpu.VMEM((num_kv_heads, rows, LANES), jnp.float32),
                pltpu.VMEM((num_kv_heads, rows, head_dim_padded), jnp.float32),
            ],
        ),
        out_shape=jax.ShapeDtypeStruct(q_padded.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel",), vmem_limit_bytes=vmem_limit_bytes
        ),
        cost_estimate=attention_cost(
            num_tokens,
            num_q_heads,
            head_dim,
            kv_pages.shape,
            itemsize,
            max_seqs,
            pages_per_seq,
            kv_itemsize=kv_pages.dtype.itemsize,
            scale_bytes_per_page=page_size * columns * 4,
        ),
        interpret=interpret,
        name="ragged_paged_attention_quantized" if quantized else "ragged_paged_attention",
    )(
        kv_lens,
        block_tables.reshape(-1),
        cu_q_lens,
        num_seqs,
        q_padded,
        kv_pages,
        *([kv_scales] if quantized else []),
    )
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
    exceeds 3/4 of the 16 MiB scoped default. An 8-bit pool (``QuantizedKVPool``) is DMA'd as
    codes and scales and dequantised in VMEM; its page_size must fill int8's 32-row tiles.
    """
    kv_scales = None
    if isinstance(kv_pages, QuantizedKVPool):
        kv_pages, kv_scales = kv_pages.codes, kv_pages.scales
    num_kv_heads = _validate(
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
    return _ragged_paged_attention(
        q,
        kv_pages,
        kv_scales,
        kv_lens,
        block_tables,
        cu_q_lens,
        num_seqs,
        scale=float(scale),
        soft_cap=soft_cap,
        sliding_window=sliding_window,
        num_kv_heads=num_kv_heads,
        pages_per_block=num_kv_pages_per_block or pages,
        block_q=num_queries_per_block or block_q,
        vmem_limit_bytes=vmem_limit_bytes,
        interpret=interpret,
    )
