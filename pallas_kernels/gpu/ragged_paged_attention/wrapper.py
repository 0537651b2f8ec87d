"""The public entry point of GPU ragged paged attention: validates the arguments, picks the sizes
(``sizes.py``), runs the decode kernel and the prefill kernel over the step and merges the decode
splits; a decode-only step runs the decode kernel (and the merge) alone."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels.gpu.ragged_paged_attention.kernel import PagedInputs, decode_call, prefill_call
from pallas_kernels.gpu.ragged_paged_attention.merge import merge_splits_kernel
from pallas_kernels.gpu.ragged_paged_attention.sizes import (
    MAX_HEAD_DIM,
    PALLAS_MERGE_DEFAULT,
    decode_sizes,
    prefill_sizes,
)
from pallas_kernels.kv_codes import EIGHT_BIT_DTYPES
from pallas_kernels.ragged_layout import MASK_VALUE, sanitize_cu_q_lens
from pallas_kernels.validation import (
    FLOAT_DTYPES,
    validate_common,
    validate_int_array,
    validate_scales,
)

TUNING = (
    "decode_dot",
    "num_splits",
    "decode_block_k",
    "decode_num_warps",
    "decode_num_stages",
    "prefill_block_q",
    "prefill_block_k",
    "prefill_num_warps",
    "prefill_num_stages",
    "pallas_merge",
)


def prefill_blocks(cu_q_lens, kv_lens, *, block_q: int, num_blocks: int) -> jax.Array:
    """``[4, N]`` int32 per query block of the sequences with two or more queries: its sequence,
    first row, query count (0: an unused block) and first query's position. ``cu_q_lens`` is
    sanitised."""
    max_seqs = kv_lens.shape[0]
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    q_lens = jnp.where(q_lens >= 2, q_lens, 0)  # one-query sequences are the decode kernel's
    blocks_per_seq = (q_lens + block_q - 1) // block_q
    blocks_end = jnp.cumsum(blocks_per_seq)
    block_ids = jnp.arange(num_blocks, dtype=jnp.int32)
    seq = jnp.minimum(jnp.searchsorted(blocks_end, block_ids, side="right"), max_seqs - 1)
    local = block_ids - (blocks_end[seq] - blocks_per_seq[seq])
    count = jnp.where(
        block_ids < blocks_end[-1], jnp.clip(q_lens[seq] - local * block_q, 0, block_q), 0
    )
    first_row = cu_q_lens[seq] + local * block_q
    first_pos = kv_lens[seq] - q_lens[seq] + local * block_q
    return jnp.stack([seq, first_row, count, first_pos]).astype(jnp.int32)


def merge_splits(acc, row_max, row_sum) -> jax.Array:
    """Log-sum-exp merge of the decode splits: ``acc [N, ..., R, lanes]``, ``row_max`` and
    ``row_sum [N, ..., R]`` -> ``[..., R, lanes]`` float32 (rows that saw no key: zeros).

    XLA makes it three small reductions (the max, the sum, the weighted rows). One variadic
    reduction carrying ``(max, sum, acc)`` was slower on the H200 (2211e4a): XLA materialised
    the max and sum broadcast to ``acc``'s shape in two more kernels first."""
    overall = jnp.max(row_max, axis=0)
    weight = jnp.where(row_max > MASK_VALUE, jnp.exp(row_max - overall[None]), 0.0)
    total = jnp.sum(row_sum * weight, axis=0)
    out = jnp.sum(acc * weight[..., None], axis=0)
    safe = jnp.where(total > 0, total, 1.0)
    return jnp.where((total > 0)[..., None], out / safe[..., None], 0.0)


def _validate(q, k_pages, v_pages, scales, kv_lens, block_tables, cu_q_lens, num_seqs, **options):
    if scales:
        validate_scales(k_pages, *scales)
    validate_common(
        q, k_pages, v_pages, pool_dtypes=EIGHT_BIT_DTYPES if scales else FLOAT_DTYPES, **options
    )
    head_dim = q.shape[2]
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(
            f"head_dim {head_dim} is more than the {MAX_HEAD_DIM} lanes a program can hold"
        )
    if k_pages.shape[2] < 1:
        raise ValueError(f"k_pages page_size must be >= 1, got {k_pages.shape[2]}")
    if block_tables.ndim != 2:
        raise ValueError(
            f"block_tables must be [max_seqs, pages_per_seq], got {block_tables.shape}"
        )
    max_seqs = block_tables.shape[0]
    validate_int_array("block_tables", block_tables, block_tables.shape)
    validate_int_array("kv_lens", kv_lens, (max_seqs,))
    validate_int_array("cu_q_lens", cu_q_lens, (max_seqs + 1,))
    validate_int_array("num_seqs", num_seqs, (1,))


@functools.partial(
    jax.jit,
    static_argnames=("scale", "soft_cap", "sliding_window", "decode_only", "interpret", *TUNING),
)
def ragged_paged_attention_gpu(
    q: jax.Array,  # [T, Hq, D]
    k_pages,  # [Hkv, P, page_size, D], or QuantizedPages (codes [Hkv, P, page_size, D], scales)
    v_pages,  # as k_pages
    kv_lens: jax.Array,  # [S]
    block_tables: jax.Array,  # [S, W]
    cu_q_lens: jax.Array,  # [S + 1]
    num_seqs: jax.Array,  # [1]
    *,
    scale: float | None = None,
    soft_cap: float | None = None,
    sliding_window: int | None = None,
    decode_only: bool = False,
    interpret: bool = False,
    decode_dot: bool | None = None,
    num_splits: int | None = None,
    decode_block_k: int | None = None,
    decode_num_warps: int | None = None,
    decode_num_stages: int | None = None,
    prefill_block_q: int | None = None,
    prefill_block_k: int | None = None,
    prefill_num_warps: int | None = None,
    prefill_num_stages: int | None = None,
    pallas_merge: bool | None = None,
) -> jax.Array:  # [T, Hq, D]
    """Causal attention of a ragged step's query rows over their sequences' paged K/V, on a GPU
    (Pallas Triton), or in Pallas's interpreter anywhere.

    Args:
      q: ``[num_tokens, num_heads, head_dim]``; sequence s owns rows
        ``cu_q_lens[s]:cu_q_lens[s + 1]``, its query j at position ``kv_lens[s] - q_len + j``.
      k_pages: ``[num_kv_heads, num_pages, page_size, head_dim]`` key pool (this step's keys
        already written), float32 / bfloat16 / float16; or a ``QuantizedPages`` 8-bit pool
        (``values`` int8 codes or fp8 codes as uint8 bits, ``scales`` ``[.., G]`` uint16 bfloat16
        bits per token and group of head_dim / G lanes), dequantised per key block in the kernel.
      v_pages: value pool, as ``k_pages``.
      kv_lens: ``[max_seqs]`` int32 keys cached per sequence, this step's included.
      block_tables: ``[max_seqs, pages_per_seq]`` int32 page ids of each sequence, in order
        (entries past a sequence's pages must still be valid page ids).
      cu_q_lens: ``[max_seqs + 1]`` int32 cumulative query lengths from 0; entries past
        ``num_seqs`` are ignored.
      num_seqs: ``[1]`` int32 sequences in use; rows past ``cu_q_lens[num_seqs]`` return zeros.
      scale: logit scale, ``head_dim ** -0.5`` when None.
      soft_cap: if set, logits become ``soft_cap * tanh(logits / soft_cap)`` after scaling.
      sliding_window: if set, a query at position p sees keys in ``(p - sliding_window, p]``.
      decode_only: the step holds one row per sequence slot (``num_tokens == max_seqs``) and
        no sequence has more than one query: the prefill kernel is left out and the decode
        kernel (or the split merge) writes every row of the output (the engine's decode steps,
        see ``jaxgen/engine/step/step_layout.py``). A sequence with more queries gets zeros.
      interpret: run the kernels in Pallas's interpreter (on CPU).
      decode_dot: score decode rows with ``tl.dot`` (group padded to 16 rows) or without the MMA
        units (a float32 multiply and sum); None: the dot (measured faster on an H200, see
        ``sizes.py``).
      num_splits: key ranges per (decode sequence, KV head), merged by log-sum-exp; None: enough
        for 4 programs per SM of a 132-SM GPU (see ``sizes.py``). Capped at the key blocks of a
        full block table.
      decode_block_k, prefill_block_k: keys per block (powers of two; >= 16 where ``tl.dot``
        runs). prefill_block_q: query tokens per prefill block (x the padded group >= 16 rows).
      decode_num_warps, decode_num_stages, prefill_num_warps, prefill_num_stages: Triton launch
        parameters of each kernel.
      pallas_merge: merge the decode splits in one Pallas kernel (``merge.py``) instead of XLA's
        three reductions; None: ``sizes.PALLAS_MERGE_DEFAULT``.

    Returns:
      ``[num_tokens, num_heads, head_dim]`` in ``q.dtype``.
    """
    scales = []
    if hasattr(k_pages, "scales"):  # an 8-bit pool
        scales = [k_pages.scales, v_pages.scales]
        k_pages, v_pages = k_pages.values, v_pages.values
    options = dict(scale=scale, soft_cap=soft_cap, sliding_window=sliding_window)
    _validate(q, k_pages, v_pages, scales, kv_lens, block_tables, cu_q_lens, num_seqs, **options)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, _, page_size, _ = k_pages.shape
    max_seqs, width = block_tables.shape
    if decode_only and num_tokens != max_seqs:
        raise ValueError(
            f"decode_only needs one row per sequence slot: q has {num_tokens} rows for "
            f"{max_seqs} block_tables rows"
        )
    group = num_heads // num_kv_heads
    decode = decode_sizes(
        group=group,
        head_dim=head_dim,
        max_seqs=max_seqs,
        num_kv_heads=num_kv_heads,
        max_keys=width * page_size,
        use_dot=decode_dot,
        num_splits=num_splits,
        block_k=decode_block_k,
        num_warps=decode_num_warps,
        num_stages=decode_num_stages,
    )
    prefill = prefill_sizes(
        group=group,
        head_dim=head_dim,
        block_q=prefill_block_q,
        block_k=prefill_block_k,
        num_warps=prefill_num_warps,
        num_stages=prefill_num_stages,
    )
    if num_tokens == 0 or max_seqs == 0 or width == 0:
        return jnp.zeros_like(q)
    options.update(scale=head_dim**-0.5 if scale is None else scale, interpret=interpret)
    cu_q_lens = sanitize_cu_q_lens(cu_q_lens, num_seqs, num_tokens)
    pool = PagedInputs(q, k_pages, v_pages, scales, kv_lens, block_tables)

    # A mixed step: padding rows stay zero, every other row is written once, by one kernel.
    out = None if decode_only else jnp.zeros_like(q)
    if decode.num_splits == 1:
        out = decode_call(pool, cu_q_lens, out, sizes=decode, decode_only=decode_only, **options)
    else:
        acc, row_max, row_sum = decode_call(pool, cu_q_lens, None, sizes=decode, **options)
        if PALLAS_MERGE_DEFAULT if pallas_merge is None else pallas_merge:
            # The merged rows go straight into the output, in its dtype: no slice, cast or
            # scatter after the kernel.
            out = merge_splits_kernel(
                acc,
                row_max,
                row_sum,
                cu_q_lens,
                jax.ShapeDtypeStruct(q.shape, q.dtype) if decode_only else out,
                group=group,
                decode_only=decode_only,
                interpret=interpret,
            )
        else:  # the group's real rows and the head's lanes only: the padding is never read
            merged = merge_splits(
                acc[..., :group, :head_dim], row_max[..., :group], row_sum[..., :group]
            )  # [S, Hkv, G, D]
            merged = merged.reshape(max_seqs, num_heads, head_dim).astype(q.dtype)
            if decode_only:  # one row per sequence slot: the merged rows are the output
                return merged
            # XLA's reductions spread the splits over the whole GPU: a Pallas merge with one
            # program per (slot, KV head) walking its splits in turn made a batch-1 call over
            # 32k keys 75 us (H200, 075a864), where the whole wrapper had taken 54 (d2b7523).
            is_decode = cu_q_lens[1:] - cu_q_lens[:-1] == 1
            rows = jnp.where(is_decode, cu_q_lens[:-1], num_tokens)
            out = out.at[rows].set(merged, mode="drop")
    if decode_only:
        return out

    # A sequence with two or more queries adds at most one partly filled block, and there are at
    # most T // 2 of them.
    prefill_seqs = min(max_seqs, num_tokens // 2)
    num_blocks = (num_tokens + prefill_seqs * (prefill.block_q - 1)) // prefill.block_q
    if num_blocks:
        blocks = prefill_blocks(cu_q_lens, kv_lens, block_q=prefill.block_q, num_blocks=num_blocks)
        out = prefill_call(pool, blocks, out, sizes=prefill, **options)
    return out


__all__ = ["TUNING", "merge_splits", "prefill_blocks", "ragged_paged_attention_gpu"]
