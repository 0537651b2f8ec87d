"""The walk shared by the ragged paged-attention kernels (float and 8-bit pools): which
(sequence, KV block) pairs a query block needs, their double-buffered page DMAs, the causal and
window mask, and the online softmax each pair updates.

Within a grid step the kernel walks every (sequence, KV block) pair the block's tokens need, in
order: sequences that own rows of the block, and for each the KV blocks from the sliding-window
start to its last query in the block. A KV block's pages are DMA'd page by page from HBM into a
double-buffered VMEM slab; the next pair's DMA is issued before the current pair is computed, also
across sequence boundaries. Pages past the last needed key are not fetched. Every pair updates
an online softmax (f32) for all rows of the block; rows of other sequences are masked out and keep
their state, so no dynamic row slicing is needed. Rows owned by no sequence (padding past
``cu_q_lens[num_seqs]``, empty sequences) output zeros.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.tpu.ragged_paged_attention.reference import MASK_VALUE
from pallas_kernels.tpu.tiling import LANES, cdiv


def walk_kv_blocks(
    kv_lens_ref,  # [max_seqs] SMEM
    block_tables_ref,  # [max_seqs * pages_per_seq] SMEM, flattened
    cu_q_lens_ref,  # [max_seqs + 1] SMEM
    num_seqs_ref,  # [1] SMEM
    *,
    num_pages: int,
    page_size: int,
    pages_per_block: int,
    pages_per_seq: int,
    block_q: int,
    group: int,
    sliding_window: int | None,
    page_copies,
    attend,
):
    """Runs this grid step's pairs. ``page_copies(page_id, slot, i)`` gives the DMA descriptors
    that bring pool page ``page_id`` into page ``i`` of VMEM slot ``slot``; ``attend(slot, mask,
    live_keys)`` computes one pair: ``mask`` [block_q * group, block_k] says which (row, key)
    pairs attend, and keys at or past ``live_keys`` in the slab may be stale VMEM."""
    block_k = pages_per_block * page_size
    rows = block_q * group
    max_seqs = kv_lens_ref.shape[0]
    num_seqs = jnp.minimum(num_seqs_ref[0], max_seqs)
    row_start = pl.program_id(0) * block_q  # first token of this block
    row_end = row_start + block_q

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

    def copies(seq, kv_block, slot):
        """The DMAs of the KV block's pages, each with whether its page is needed."""
        key_end, _, _ = seq_extent(seq)
        page_end = cdiv(key_end, page_size)
        out = []
        for i in range(pages_per_block):
            page = kv_block * pages_per_block + i
            page_id = block_tables_ref[seq * pages_per_seq + jnp.minimum(page, pages_per_seq - 1)]
            page_id = jnp.clip(page_id, 0, num_pages - 1)
            out += [(page < page_end, copy) for copy in page_copies(page_id, slot, i)]
        return out

    def start_fetch(seq, kv_block, slot):
        for needed, copy in copies(seq, kv_block, slot):
            pl.when(needed)(copy.start)

    def wait_fetch(seq, kv_block, slot):
        for needed, copy in copies(seq, kv_block, slot):
            pl.when(needed)(copy.wait)

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
        attend(slot, mask, key_end - kv_block * block_k)

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


def reset_softmax(m_ref, l_ref, acc_ref):
    """m_ref / l_ref [Hkv, rows, 128] running max / sum (lane-broadcast), acc_ref [Hkv, rows, Dp]
    the unnormalised output, all float32."""
    m_ref[...] = jnp.full(m_ref.shape, MASK_VALUE, jnp.float32)
    l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
    acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)


def update_softmax(
    m_ref,
    l_ref,
    acc_ref,
    head: int,
    scores,  # [rows, block_k] float32, before scaling
    mask,  # [rows, block_k]
    weighted_values,  # probs [rows, block_k] float32 -> [rows, Dp] float32
    *,
    scale: float,
    soft_cap: float | None,
):
    """One KV block's step of the online softmax of KV head ``head``."""
    scores = scores * scale
    if soft_cap is not None:
        scores = soft_cap * jnp.tanh(scores / soft_cap)
    scores = jnp.where(mask, scores, MASK_VALUE)
    m_prev = m_ref[head][:, :1]  # [rows, 1]
    m_next = jnp.maximum(m_prev, jnp.max(scores, axis=1, keepdims=True))
    probs = jnp.where(mask, jnp.exp(scores - m_next), 0.0)  # [rows, block_k]
    alpha = jnp.exp(m_prev - m_next)  # [rows, 1]
    l_next = alpha * l_ref[head][:, :1] + jnp.sum(probs, axis=1, keepdims=True)
    acc_ref[head] = alpha * acc_ref[head] + weighted_values(probs)
    rows = acc_ref.shape[1]
    m_ref[head] = jnp.broadcast_to(m_next, (rows, LANES))
    l_ref[head] = jnp.broadcast_to(l_next, (rows, LANES))


def write_output(out_ref, l_ref, acc_ref, *, group: int):
    """out_ref [block_q, Hq, Dp]: each head's accumulator over its sum (zeros where it is 0)."""
    num_kv_heads, rows, head_dim = acc_ref.shape
    for head in range(num_kv_heads):
        row_sum = l_ref[head][:, :1]
        inverse = jnp.where(row_sum > 0.0, 1.0 / jnp.where(row_sum > 0.0, row_sum, 1.0), 0.0)
        out = (acc_ref[head] * inverse).astype(out_ref.dtype)  # [rows, Dp]
        out_ref[:, head * group : (head + 1) * group, :] = out.reshape(
            rows // group, group, head_dim
        )
