"""Ragged paged attention for prefill and mixed batches: a flat batch of query tokens from many
sequences, each attending causally to its own paged K/V (earlier pages plus the chunk just written).

  q:           [T, Hq, D], tokens of sequence s at rows cu_q_lens[s]:cu_q_lens[s+1]
  kv_lens:     [S] tokens cached for sequence s, the chunk included; query j of sequence s sits at
               position kv_lens[s] - q_len[s] + j and attends to keys at positions <= its own.
  block_tables:[S, W]; cu_q_lens: [S+1]; num_seqs: [1], sequences in use (rows past it are padding).

The Pallas kernel runs over a grid of (query block, KV head). The wrapper cuts every sequence's
rows into blocks of ``block_q`` tokens (a block never spans two sequences), gathers them into a
``[num_blocks, num_kv_heads, block_q * group, head_dim]`` array, and after the kernel scatters
the outputs back to the flat rows. Each program walks its sequence's pages with an online softmax,
from the first key any of its queries can see to the last query's position.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.kv_codes import EIGHT_BIT_DTYPES, codes_to_float, scales_to_float
from pallas_kernels.paged_attention import (
    FLOAT_DTYPES,
    MASK_VALUE,
    compiler_params,
    default_pages_per_compute_block,
    gather_pages,
    initial_carry,
    next_power_of_2,
    normalize,
    online_softmax_step,
    validate_common,
    validate_int_array,
    validate_scales,
)


def _sanitize_cu_q_lens(cu_q_lens: jax.Array, num_seqs: jax.Array, num_tokens: int) -> jax.Array:
    """Entries past ``num_seqs`` become ``cu_q_lens[num_seqs]`` (empty padding sequences)."""
    max_seqs = cu_q_lens.shape[0] - 1
    used = jnp.clip(num_seqs[0], 0, max_seqs)
    cu = jnp.where(jnp.arange(max_seqs + 1) <= used, cu_q_lens, cu_q_lens[used])
    return jnp.clip(cu, 0, num_tokens)


def ragged_paged_attention_reference(
    q: jax.Array,  # [T, Hq, D]
    k_pages: jax.Array,  # [Hkv, P, S, D]
    v_pages: jax.Array,  # [Hkv, P, S, D]
    kv_lens: jax.Array,  # [S]
    block_tables: jax.Array,  # [S, W]
    cu_q_lens: jax.Array,  # [S + 1]
    num_seqs: jax.Array,  # [1]
    *,
    scale: float | None = None,
    soft_cap: float | None = None,
    sliding_window: int | None = None,
) -> jax.Array:  # [T, Hq, D]
    """Pure-JAX ragged paged attention; rows not covered by the first ``num_seqs`` sequences are zero."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, _, page_size, _ = k_pages.shape
    group = num_heads // num_kv_heads
    max_seqs, width = block_tables.shape
    scale = head_dim**-0.5 if scale is None else scale
    cu_q_lens = _sanitize_cu_q_lens(cu_q_lens, num_seqs, num_tokens)
    rows = jnp.arange(num_tokens)
    seq = jnp.clip(jnp.searchsorted(cu_q_lens[1:], rows, side="right"), 0, max_seqs - 1)
    in_use = (rows < cu_q_lens[-1]) & (seq < num_seqs[0])
    q_len = cu_q_lens[seq + 1] - cu_q_lens[seq]
    q_pos = kv_lens[seq] - q_len + (rows - cu_q_lens[seq])  # [T]
    out = jnp.zeros((num_tokens, num_heads, head_dim), jnp.float32)
    qg = q.reshape(num_tokens, num_kv_heads, group, head_dim).astype(jnp.float32) * scale
    key_pos = jnp.arange(width * page_size)
    # One sequence at a time keeps memory at [T, W * S] instead of [T, W * S, Hkv, D].
    for s in range(max_seqs):
        k = gather_pages(k_pages, block_tables[s]).reshape(
            num_kv_heads, width * page_size, head_dim
        )
        v = gather_pages(v_pages, block_tables[s]).reshape(
            num_kv_heads, width * page_size, head_dim
        )
        scores = jnp.einsum("thgd,hld->thgl", qg, k.astype(jnp.float32))
        if soft_cap is not None:
            scores = soft_cap * jnp.tanh(scores / soft_cap)
        valid = (key_pos[None, :] <= q_pos[:, None]) & (key_pos[None, :] < kv_lens[s])
        if sliding_window is not None:
            valid &= key_pos[None, :] > q_pos[:, None] - sliding_window
        valid &= ((seq == s) & in_use)[:, None]
        scores = jnp.where(valid[:, None, None, :], scores, MASK_VALUE)
        probs = jnp.where(valid[:, None, None, :], jax.nn.softmax(scores, axis=-1), 0.0)
        out = out + jnp.einsum("thgl,hld->thgd", probs, v.astype(jnp.float32)).reshape(out.shape)
    return out.astype(q.dtype)


def dequantize_block(
    codes: jax.Array,  # [K, D] int8, or uint8 holding fp8 bits
    scales: jax.Array,  # [n, S, G] uint16 (bfloat16 bits), n * S = K
    dtype,
) -> jax.Array:  # [K, D]
    """8-bit codes times the scale of their token and lane group (G groups of D / G lanes)."""
    block_k, head_dim = codes.shape
    groups = scales.shape[-1]
    scales = scales_to_float(scales.reshape(block_k, groups))
    lane_group = jnp.arange(head_dim, dtype=jnp.int32) // (head_dim // groups)  # [D]
    one_hot = (lane_group[None, :] == jnp.arange(groups, dtype=jnp.int32)[:, None]).astype(
        jnp.float32
    )  # [G, D]
    full = jnp.sum(scales[:, :, None] * one_hot[None, :, :], axis=1)  # [K, D]
    return (codes_to_float(codes) * full).astype(dtype)


def _ragged_kernel(
    counts_ref,  # [N] whole array: query tokens in each block (0 for unused blocks)
    positions_ref,  # [N] whole array: position of each block's first query
    kv_lens_ref,  # [N] whole array: keys cached for each block's sequence
    block_tables_ref,  # [W_padded] pages of this block's sequence
    q_ref,  # [block_q * group, D], row r is token r // group, head r % group
    k_pages_ref,  # [P, S, D] this KV head's pool (8-bit codes when quantized)
    v_pages_ref,  # [P, S, D]
    *refs,  # 8-bit pool: k_scales_ref, v_scales_ref [P, S, G]; then out_ref [block_q * group, D]
    group: int,
    scale: float,
    soft_cap: float | None,
    sliding_window: int | None,
    pages_per_compute_block: int,
    quantized: bool = False,
):
    out_ref = refs[-1]
    rows, head_dim = q_ref.shape
    page_size = k_pages_ref.shape[1]
    block_k = pages_per_compute_block * page_size
    total_blocks = block_tables_ref.shape[0] // pages_per_compute_block
    block_index = pl.program_id(0)
    count = counts_ref[block_index]
    first_pos = positions_ref[block_index]
    kv_len = kv_lens_ref[block_index]
    row_token = jnp.arange(rows, dtype=jnp.int32) // group
    q_pos = first_pos + row_token  # [rows]
    row_valid = row_token < count
    end_key = jnp.where(count > 0, jnp.minimum(first_pos + count, kv_len), 0)
    end_block = jnp.clip((end_key + block_k - 1) // block_k, 0, total_blocks)
    start_block = 0
    if sliding_window is not None:
        start_block = jnp.maximum(first_pos - sliding_window + 1, 0) // block_k
    q = q_ref[...]

    def body(step, carry):
        block = start_block + step
        page_ids = block_tables_ref[pl.ds(block * pages_per_compute_block, pages_per_compute_block)]
        k = k_pages_ref[page_ids].reshape(block_k, head_dim)
        v = v_pages_ref[page_ids].reshape(block_k, head_dim)
        if quantized:  # codes times their group's scale, in registers
            k = dequantize_block(k, refs[0][page_ids], q_ref.dtype)
            v = dequantize_block(v, refs[1][page_ids], q_ref.dtype)
        key_pos = block * block_k + jnp.arange(block_k, dtype=jnp.int32)
        mask = (key_pos[None, :] <= q_pos[:, None]) & (key_pos[None, :] < kv_len)
        if sliding_window is not None:
            mask &= key_pos[None, :] > q_pos[:, None] - sliding_window
        mask &= row_valid[:, None]
        return online_softmax_step(carry, q, k, v, mask, scale=scale, soft_cap=soft_cap)

    num_steps = jnp.maximum(end_block - start_block, 0)
    acc, _, row_sum = lax.fori_loop(0, num_steps, body, initial_carry(rows, head_dim))
    out_ref[...] = normalize(acc, row_sum).astype(out_ref.dtype)


def query_blocks(cu_q_lens, kv_lens, num_seqs, *, num_tokens, block_q, num_blocks):
    """Splits each sequence's rows into blocks of ``block_q``; returns per-block metadata.

    Returns ``(seq, counts, positions, rows)``: the sequence of each block ``[N]``, its number of
    real queries ``[N]``, the position of its first query ``[N]``, and its flat row indices
    ``[N, block_q]`` (``num_tokens`` marks an empty slot).
    """
    max_seqs = kv_lens.shape[0]
    cu = _sanitize_cu_q_lens(cu_q_lens, num_seqs, num_tokens)
    q_lens = jnp.maximum(cu[1:] - cu[:-1], 0)  # [S]
    blocks_per_seq = (q_lens + block_q - 1) // block_q
    blocks_end = jnp.cumsum(blocks_per_seq)  # [S], inclusive
    block_ids = jnp.arange(num_blocks, dtype=jnp.int32)
    seq = jnp.minimum(jnp.searchsorted(blocks_end, block_ids, side="right"), max_seqs - 1)
    local = block_ids - (blocks_end[seq] - blocks_per_seq[seq])
    in_use = block_ids < blocks_end[-1]
    counts = jnp.where(in_use, jnp.clip(q_lens[seq] - local * block_q, 0, block_q), 0)
    positions = kv_lens[seq] - q_lens[seq] + local * block_q
    slots = jnp.arange(block_q, dtype=jnp.int32)[None, :]
    rows = jnp.where(
        slots < counts[:, None], cu[seq][:, None] + local[:, None] * block_q + slots, num_tokens
    )
    return seq, counts.astype(jnp.int32), positions.astype(jnp.int32), rows


@functools.partial(
    jax.jit,
    static_argnames=(
        "scale",
        "soft_cap",
        "sliding_window",
        "interpret",
        "block_q",
        "pages_per_compute_block",
        "num_warps",
        "num_stages",
    ),
)
def ragged_paged_attention(
    q: jax.Array,  # [T, Hq, D]
    k_pages,  # [Hkv, P, S, D], or QuantizedPages (8-bit values [Hkv, P, S, D], scales [.., G])
    v_pages,  # as k_pages
    kv_lens: jax.Array,  # [S]
    block_tables: jax.Array,  # [S, W]
    cu_q_lens: jax.Array,  # [S + 1]
    num_seqs: jax.Array,  # [1]
    *,
    scale: float | None = None,
    soft_cap: float | None = None,
    sliding_window: int | None = None,
    interpret: bool = False,
    block_q: int | None = None,
    pages_per_compute_block: int | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
) -> jax.Array:  # [T, Hq, D]
    """Pallas ragged paged attention: causal attention of a flat token batch over paged K/V.

    Args:
      q: ``[num_tokens, num_heads, head_dim]``; sequence s owns rows
        ``cu_q_lens[s]:cu_q_lens[s + 1]``.
      k_pages: ``[num_kv_heads, num_pages, page_size, head_dim]`` key pool (chunk already written),
        or a ``QuantizedPages`` 8-bit pool (int8 codes or fp8 codes as uint8 bits, float32
        scales per token and lane group), dequantised block by block inside the kernel.
      v_pages: value pool, same shape and dtype as ``k_pages``.
      kv_lens: ``[max_seqs]`` int32 keys cached per sequence, the current chunk included.
      block_tables: ``[max_seqs, pages_per_seq]`` int32 page ids of each sequence, in order.
      cu_q_lens: ``[max_seqs + 1]`` int32 cumulative query lengths, starting at 0.
      num_seqs: ``[1]`` int32 sequences in use; rows past ``cu_q_lens[num_seqs]`` return zeros.
      scale: logit scale, ``head_dim ** -0.5`` when None.
      soft_cap: if set, logits become ``soft_cap * tanh(logits / soft_cap)`` after scaling.
      sliding_window: if set, a query at position p sees keys in ``(p - sliding_window, p]``.
      interpret: run the kernel in the Pallas interpreter (needed on CPU).
      block_q: query tokens per program; ``block_q * group`` rows (power of two, >= 16 on GPU).
        When None, 64 rows.
      pages_per_compute_block: pages per key block (power of two); about 128 keys when None.
      num_warps, num_stages: Triton launch parameters (GPU only).

    Returns:
      ``[num_tokens, num_heads, head_dim]`` attention output in ``q.dtype``.
    """
    scales = []
    if hasattr(k_pages, "scales"):  # an 8-bit pool
        scales = [k_pages.scales, v_pages.scales]
        k_pages, v_pages = k_pages.values, v_pages.values
        validate_scales(k_pages, *scales)
    validate_common(
        q,
        k_pages,
        v_pages,
        scale=scale,
        soft_cap=soft_cap,
        sliding_window=sliding_window,
        pool_dtypes=EIGHT_BIT_DTYPES if scales else FLOAT_DTYPES,
    )
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, _, page_size, _ = k_pages.shape
    if block_tables.ndim != 2:
        raise ValueError(
            f"block_tables must be [max_seqs, pages_per_seq], got {block_tables.shape}"
        )
    max_seqs, pages_per_seq = block_tables.shape
    validate_int_array("block_tables", block_tables, block_tables.shape)
    validate_int_array("kv_lens", kv_lens, (max_seqs,))
    validate_int_array("cu_q_lens", cu_q_lens, (max_seqs + 1,))
    validate_int_array("num_seqs", num_seqs, (1,))
    if num_tokens == 0 or max_seqs == 0 or pages_per_seq == 0:
        return jnp.zeros_like(q)
    group = num_heads // num_kv_heads
    padded_group = next_power_of_2(group)
    if block_q is None:
        block_q = max(1, 64 // padded_group)
    if block_q < 1:
        raise ValueError(f"block_q must be >= 1, got {block_q}")
    if pages_per_compute_block is None:
        pages_per_compute_block = default_pages_per_compute_block(page_size, pages_per_seq)
    if pages_per_compute_block < 1:
        raise ValueError(f"pages_per_compute_block must be >= 1, got {pages_per_compute_block}")

    # Each used sequence adds at most one partly filled block.
    num_blocks = (num_tokens + min(max_seqs, num_tokens) * (block_q - 1)) // block_q
    seq, counts, positions, rows = query_blocks(
        cu_q_lens, kv_lens, num_seqs, num_tokens=num_tokens, block_q=block_q, num_blocks=num_blocks
    )
    total_blocks = -(-pages_per_seq // pages_per_compute_block)
    padded_width = total_blocks * pages_per_compute_block
    block_tables = jnp.pad(block_tables, ((0, 0), (0, padded_width - pages_per_seq)))[seq]
    q_rows = jnp.concatenate([q, jnp.zeros((1, num_heads, head_dim), q.dtype)])[rows]
    q_rows = q_rows.reshape(num_blocks, block_q, num_kv_heads, group, head_dim)
    q_rows = jnp.pad(q_rows, ((0, 0), (0, 0), (0, 0), (0, padded_group - group), (0, 0)))
    block_rows = block_q * padded_group
    q_blocks = q_rows.transpose(0, 2, 1, 3, 4).reshape(
        num_blocks, num_kv_heads, block_rows, head_dim
    )

    kernel = functools.partial(
        _ragged_kernel,
        group=padded_group,
        scale=head_dim**-0.5 if scale is None else scale,
        soft_cap=soft_cap,
        sliding_window=sliding_window,
        pages_per_compute_block=pages_per_compute_block,
        quantized=bool(scales),
    )
    meta_spec = pl.BlockSpec((num_blocks,), lambda i, h: (0,))
    pool_spec = pl.BlockSpec((None, *k_pages.shape[1:]), lambda i, h: (h, 0, 0, 0))
    row_spec = pl.BlockSpec((None, None, block_rows, head_dim), lambda i, h: (i, h, 0, 0))
    out_blocks = pl.pallas_call(
        kernel,
        grid=(num_blocks, num_kv_heads),
        in_specs=[
            meta_spec,
            meta_spec,
            meta_spec,
            pl.BlockSpec((None, padded_width), lambda i, h: (i, 0)),
            row_spec,
            pool_spec,
            pool_spec,
            *[pl.BlockSpec((None, *x.shape[1:]), lambda i, h: (h, 0, 0, 0)) for x in scales],
        ],
        out_specs=row_spec,
        out_shape=jax.ShapeDtypeStruct(q_blocks.shape, q.dtype),
        interpret=interpret,
        compiler_params=compiler_params(interpret, num_warps, num_stages),
        name="ragged_paged_attention",
    )(counts, positions, kv_lens[seq], block_tables, q_blocks, k_pages, v_pages, *scales)

    out_blocks = out_blocks.reshape(num_blocks, num_kv_heads, block_q, padded_group, head_dim)
    out_rows = out_blocks[:, :, :, :group].transpose(0, 2, 1, 3, 4)
    out_rows = out_rows.reshape(num_blocks * block_q, num_heads, head_dim)
    out = jnp.zeros((num_tokens + 1, num_heads, head_dim), q.dtype)
    return out.at[rows.reshape(-1)].set(out_rows)[:num_tokens]
