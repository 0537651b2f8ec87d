"""Static sizing of a ragged paged-attention call on TPU: default block sizes and the cost
estimate the compiler counts (``pl.CostEstimate``), from the call's shapes alone."""

from __future__ import annotations

from jax.experimental import pallas as pl

from pallas_kernels.tpu.tiling import cdiv

KV_BLOCK_TOKENS = 512  # Target tokens per KV block: ~0.25-2 MiB per DMA slab at Hkv 1-8.
KV_BLOCK_MAX_BYTES = 2 * 1024 * 1024
PREFILL_BLOCK_ROWS = 256  # q rows (tokens x group) per block for prefill.


def default_block_sizes(
    num_tokens: int, max_seqs: int, group: int, page_size: int, pages_per_seq: int, page_bytes: int
) -> tuple[int, int]:
    """``(num_kv_pages_per_block, num_queries_per_block)`` for these shapes.

    KV blocks aim at 512 tokens (but at most 2 MiB): a slab big enough that the DMA of the next
    block hides the compute of this one and per-block overheads (~0.35 us) stay small, and small
    enough that two slabs plus scores fit the 16 MiB scoped VMEM (Mosaic pads the slab's 2 * Hkv_p
    rows to a sublane tile, e.g. 4 -> 16 for bf16, so a 512 KiB bf16 slab takes 2 MiB of VMEM).
    Decode-like calls (no more tokens than sequences) use 8 tokens per query block: every row of a
    block is computed against every sequence it holds, so fewer rows waste less. Prefill uses ~256 rows (tokens x group), 8..128 tokens: enough MXU work per KV byte.
    """
    pages = max(1, min(KV_BLOCK_TOKENS // page_size, KV_BLOCK_MAX_BYTES // page_bytes))
    pages = min(pages, pages_per_seq)
    if num_tokens <= max_seqs:
        return pages, 8
    block_q = max(8, min(128, PREFILL_BLOCK_ROWS // group) // 8 * 8)
    return pages, min(block_q, cdiv(num_tokens, 8) * 8)


def attention_cost(
    num_tokens: int,
    num_q_heads: int,
    head_dim: int,
    kv_pages_shape,
    itemsize: int,
    max_seqs: int,
    pages_per_seq: int,
    *,
    kv_itemsize: int | None = None,
    scale_bytes_per_page: int = 0,
    dot_passes: int = 1,
) -> pl.CostEstimate:
    """Static cost of one call (``itemsize``: q's; ``kv_itemsize``: the pool's, default q's;
    ``scale_bytes_per_page``: an 8-bit pool's scales, read with each page; ``dot_passes``: how
    many times each score and value dot is done, once per scale group on an 8-bit pool).

    KV bytes: every page a live sequence can own is read once, i.e. ``min(max_seqs, T) *
    pages_per_seq`` pages (at most T sequences have queries), capped at the pool size. For a
    decode step whose block tables are as wide as the longest sequence this is the live KV. A
    prefill chunk split over several query blocks re-reads its prefix once per block; that extra
    is not counted (prefill is compute-bound). Flops assume every query sees every page.
    """
    num_pages, page_size, num_rows, head_dim_padded = kv_pages_shape
    page_bytes = page_size * num_rows * head_dim_padded * (kv_itemsize or itemsize)
    page_bytes += scale_bytes_per_page
    kv_pages_read = min(min(max_seqs, num_tokens) * pages_per_seq, num_pages)
    keys = pages_per_seq * page_size
    q_bytes = num_tokens * num_q_heads * head_dim_padded * itemsize
    return pl.CostEstimate(
        flops=4 * dot_passes * num_tokens * num_q_heads * head_dim_padded * keys,
        transcendentals=num_tokens * num_q_heads * keys,
        bytes_accessed=kv_pages_read * page_bytes + 2 * q_bytes,
    )


VMEM_SCOPED_DEFAULT = 16 * 1024 * 1024  # v5e scoped default; above it we raise the limit.


def vmem_limit(vmem_bytes: int, vmem_limit_bytes: int | None) -> int | None:
    """The scoped VMEM limit to ask for: the caller's, else twice the estimate when it exceeds
    3/4 of the default (capped at 100 MiB), else the default (None)."""
    if vmem_limit_bytes is None and vmem_bytes > VMEM_SCOPED_DEFAULT * 3 // 4:
        return min(2 * vmem_bytes, 100 * 1024 * 1024)
    return vmem_limit_bytes
