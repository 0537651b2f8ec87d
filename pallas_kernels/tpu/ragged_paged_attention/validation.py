"""Argument checks of ``ragged_paged_attention_tpu`` (float and 8-bit pools): a ``ValueError``
naming the bad argument."""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.tpu.kv_pool.layout import POOL_DTYPES, padded_head_dim, tile_friendly
from pallas_kernels.tpu.kv_pool.quantized import scale_rows
from pallas_kernels.tpu.tiling import LANES, dtype_packing, sublane_rows

CODE_DTYPES = (jnp.dtype(jnp.int8), jnp.dtype(jnp.float8_e4m3fn))


def validate_arrays(q, kv_pages, kv_scales, metadata, num_kv_heads: int | None) -> int:
    """Checks q, the pool (``kv_scales``: None for a float pool) and ``metadata`` (kv_lens,
    block_tables, cu_q_lens, num_seqs); returns the number of real KV heads."""
    if q.ndim != 3:
        raise ValueError(f"q must be [T, Hq, D], got shape {q.shape}")
    if q.dtype not in POOL_DTYPES:
        raise ValueError(f"q must be float32 or bfloat16, got {q.dtype}")
    if kv_pages.ndim != 4:
        raise ValueError(f"kv_pages must be [P, S, 2 * Hkv_p, Dp], got shape {kv_pages.shape}")
    _, num_q_heads, head_dim = q.shape
    num_pages, page_size, num_rows, head_dim_padded = kv_pages.shape
    if kv_scales is None and kv_pages.dtype != q.dtype:
        raise ValueError(f"kv_pages dtype {kv_pages.dtype} must match q dtype {q.dtype}")
    if kv_scales is not None:
        if kv_pages.dtype not in CODE_DTYPES:
            raise ValueError(f"kv_pages codes must be int8 or float8_e4m3fn, got {kv_pages.dtype}")
        if page_size % LANES:
            raise ValueError(
                f"kv_pages page_size {page_size} must be a multiple of {LANES} for an 8-bit pool"
            )
        expected = (num_pages, scale_rows(num_rows, head_dim), page_size)
        if kv_scales.shape != expected or kv_scales.dtype != jnp.bfloat16:
            raise ValueError(
                f"kv_pages scales must be bfloat16 [P, C * G, S] = {expected}, got "
                f"{kv_scales.dtype} {kv_scales.shape}"
            )
    packing = dtype_packing(kv_pages.dtype)
    if num_rows % 2 or num_rows % packing or not tile_friendly(num_rows // packing):
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
    _validate_metadata(*metadata)
    return num_kv_heads


def _validate_metadata(kv_lens, block_tables, cu_q_lens, num_seqs) -> None:
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


def validate_options(options, pages_per_seq: int) -> None:
    """Checks a call's static choices (``kernel.CallOptions``; ``pages_per_block`` and
    ``block_q`` as the caller gave them: None for the defaults)."""
    scale, soft_cap, window = options.scale, options.soft_cap, options.sliding_window
    pages, block_q, vmem = options.pages_per_block, options.block_q, options.vmem_limit_bytes
    if not isinstance(scale, (int, float)):
        raise ValueError(f"scale must be a Python float, got {type(scale)}")
    if soft_cap is not None and not soft_cap > 0:
        raise ValueError(f"soft_cap must be None or positive, got {soft_cap}")
    if window is not None and (not isinstance(window, int) or window < 1):
        raise ValueError(f"sliding_window must be None or a positive int, got {window}")
    if pages is not None and not 0 < pages <= pages_per_seq:
        raise ValueError(f"num_kv_pages_per_block {pages} must be in [1, {pages_per_seq}]")
    if block_q is not None and (block_q < 8 or block_q % 8):
        raise ValueError(f"num_queries_per_block {block_q} must be a positive multiple of 8")
    if vmem is not None and vmem <= 0:
        raise ValueError(f"vmem_limit_bytes must be positive, got {vmem}")
