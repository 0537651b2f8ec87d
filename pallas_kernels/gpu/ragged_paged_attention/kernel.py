"""The two Pallas Triton kernels of GPU ragged paged attention and their ``pallas_call``s.

- Decode (rows of sequences with one query): grid ``(sequence slot, KV head, split)``. A program
  holds its KV head's group of query heads for the sequence's one token and walks one of
  ``num_splits`` contiguous ranges of the sequence's keys. One split: it writes the normalised
  rows into the step's output; several: it writes its unnormalised accumulator, running max and
  running sum, which the wrapper merges by log-sum-exp.
- Prefill (rows of sequences with two or more queries): grid ``(query block, KV head)``. A block
  holds ``block_q`` consecutive tokens of one sequence times the group's heads, causal, from the
  first key its first query can see to its last query's position, and writes its rows into the
  step's output.

Each kernel skips the rows that are not its own (their programs exit before reading a key), and
both write into one output array (passed along by ``input_output_aliases``), so every row of the
step is written once: decode rows, prefill rows, and zeros for padding rows from the start.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.gpu.ragged_paged_attention import tiles
from pallas_kernels.gpu.ragged_paged_attention.sizes import (
    DecodeSizes,
    PrefillSizes,
    padded_head_dim,
)


def _split_scale_refs(refs, quantized: bool):
    """``((k_scales_ref, v_scales_ref) or (None, None), the remaining refs)``."""
    return (refs[:2], refs[2:]) if quantized else ((None, None), refs)


def _decode_kernel(
    cu_q_lens_ref,  # [S + 1] sanitised: sequences past num_seqs are empty
    kv_lens_ref,  # [S]
    tables_ref,  # [S, W]
    q_ref,  # [T, Hq, D]
    k_ref,  # [P, page_size, D] this KV head's pool (8-bit codes for an 8-bit pool)
    v_ref,  # [P, page_size, D]
    *refs,  # 8-bit: k_scales_ref, v_scales_ref [P, page_size, G]; then, one split: the output
    # passed in (unused) and out_ref [T, Hq, D]; several: acc_ref [R, lanes], max_ref and
    # sum_ref [R] of this (split, sequence, KV head)
    group: int,
    sizes: DecodeSizes,
    scale: float,
    soft_cap: float | None,
    sliding_window: int | None,
    quantized: bool,
    decode_only: bool,
):
    (k_scales_ref, v_scales_ref), refs = _split_scale_refs(refs, quantized)
    num_tokens, _, head_dim = q_ref.shape
    page_size = k_ref.shape[1]
    lanes = padded_head_dim(head_dim)
    rows, block_k, use_dot = sizes.rows, sizes.block_k, sizes.use_dot
    seq, kv_head, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)

    first_row, is_decode, kv_len = decode_row(cu_q_lens_ref, kv_lens_ref, seq)
    first_key, first_block, end_block, per_split, _ = split_ranges(
        kv_len, block_k=block_k, num_splits=sizes.num_splits, sliding_window=sliding_window
    )
    start = first_block + split * per_split
    stop = jnp.minimum(start + per_split, end_block)

    member = jnp.arange(rows, dtype=jnp.int32)
    row_ok = member < group
    heads = kv_head * group + jnp.minimum(member, group - 1)
    tokens = jnp.full((rows,), jnp.minimum(first_row, num_tokens - 1), jnp.int32)
    q = tiles.load_rows(q_ref, tokens, heads, row_ok, head_dim=head_dim, lanes=lanes)
    q = tiles.prepare_rows(q, scale=scale, use_dot=use_dot)
    dtype = (q_ref.dtype if quantized else k_ref.dtype) if use_dot else jnp.float32
    read = functools.partial(tiles.read_keys, head_dim=head_dim, lanes=lanes, dtype=dtype)

    def body(step, state):
        positions = (start + step) * block_k + jnp.arange(block_k, dtype=jnp.int32)
        key_ok = (positions >= first_key) & (positions < kv_len)
        pages, slots = tiles.key_pages(tables_ref, seq, positions, page_size=page_size)
        keys = read(k_ref, k_scales_ref, pages, slots, key_ok)
        values = read(v_ref, v_scales_ref, pages, slots, key_ok)
        scores = tiles.logits(q, keys, scale=scale, soft_cap=soft_cap, use_dot=use_dot)
        mask = jnp.broadcast_to(key_ok[None, :], scores.shape)
        return tiles.online_softmax_step(state, scores, mask, values, use_dot=use_dot)

    state = tiles.initial_state(rows, lanes)
    acc, row_max, row_sum = lax.fori_loop(0, jnp.maximum(stop - start, 0), body, state)
    if sizes.num_splits > 1:
        # Every split stores its state (an empty one: max MASK_VALUE, sum 0, which the merge
        # weighs 0).
        for ref, value in zip(refs, (acc, row_max, row_sum), strict=True):
            plgpu.store(ref, value)
    else:
        out_ref = refs[-1]
        out = tiles.normalize(acc, row_sum)  # zeros where no key was seen
        _store_decode_rows(out_ref, out, seq, tokens, heads, row_ok, is_decode, decode_only)


def decode_row(cu_q_lens_ref, kv_lens_ref, seq):
    """``(first row, is a decode sequence, keys to attend)`` of sequence slot ``seq``; keys 0
    for a sequence that is not the decode kernel's (no work)."""
    first_row = cu_q_lens_ref[seq]
    is_decode = cu_q_lens_ref[seq + 1] - first_row == 1
    return first_row, is_decode, jnp.where(is_decode, kv_lens_ref[seq], 0)


def split_ranges(kv_len, *, block_k: int, num_splits: int, sliding_window: int | None):
    """How a decode row's keys are cut into splits: ``(first key, first block, end block,
    blocks per split, splits that hold keys)``; split j holds blocks from
    ``first_block + j * per_split``, at most ``per_split`` of them, up to ``end_block``."""
    first_key = 0 if sliding_window is None else jnp.maximum(kv_len - sliding_window, 0)
    first_block = first_key // block_k
    end_block = (kv_len + block_k - 1) // block_k
    blocks = end_block - first_block
    per_split = jnp.maximum((blocks + num_splits - 1) // num_splits, 1)
    used = (blocks + per_split - 1) // per_split
    return first_key, first_block, end_block, per_split, used


def _store_decode_rows(out_ref, out, seq, tokens, heads, row_ok, is_decode, decode_only: bool):
    """A decode program's rows into the step's output: at the sequence's row (a mixed step), or
    (a decode-only step, one row per sequence slot) at row ``seq`` whatever the slot holds, so
    the kernel writes every row of the output (zeros for empty slots)."""
    if decode_only:
        tokens = jnp.full_like(tokens, seq)
        tiles.store_rows(out_ref, out, tokens, heads, row_ok, head_dim=out_ref.shape[2])
    else:
        tiles.store_rows(out_ref, out, tokens, heads, row_ok & is_decode, head_dim=out_ref.shape[2])


def _prefill_kernel(
    blocks_ref,  # [4, N]: sequence, first row, query count, first query's position per block
    kv_lens_ref,  # [S]
    tables_ref,  # [S, W]
    q_ref,  # [T, Hq, D]
    k_ref,  # [P, page_size, D] this KV head's pool (8-bit codes for an 8-bit pool)
    v_ref,  # [P, page_size, D]
    *refs,  # 8-bit: k_scales_ref, v_scales_ref [P, page_size, G]; the output passed in
    # (unused); out_ref [T, Hq, D]
    group: int,
    sizes: PrefillSizes,
    scale: float,
    soft_cap: float | None,
    sliding_window: int | None,
    quantized: bool,
):
    (k_scales_ref, v_scales_ref), (_, out_ref) = _split_scale_refs(refs, quantized)
    num_tokens, _, head_dim = q_ref.shape
    page_size = k_ref.shape[1]
    lanes = padded_head_dim(head_dim)
    rows, block_k = sizes.rows, sizes.block_k
    padded_group = rows // sizes.block_q
    block, kv_head = pl.program_id(0), pl.program_id(1)

    seq = blocks_ref[0, block]
    first_row = blocks_ref[1, block]
    count = blocks_ref[2, block]  # 0 for the bound's unused blocks: no keys, no work
    first_pos = blocks_ref[3, block]
    kv_len = kv_lens_ref[seq]
    end_key = jnp.where(count > 0, jnp.minimum(first_pos + count, kv_len), 0)
    first_key = 0 if sliding_window is None else jnp.maximum(first_pos - sliding_window + 1, 0)
    start = first_key // block_k
    stop = (end_key + block_k - 1) // block_k

    row = jnp.arange(rows, dtype=jnp.int32)
    token, member = row // padded_group, row % padded_group  # row r: token r // Gp, head r % Gp
    row_ok = (token < count) & (member < group)
    heads = kv_head * group + jnp.minimum(member, group - 1)
    tokens = jnp.clip(first_row + jnp.minimum(token, count - 1), 0, num_tokens - 1)
    q_positions = first_pos + token
    q = tiles.load_rows(q_ref, tokens, heads, row_ok, head_dim=head_dim, lanes=lanes)
    dtype = q_ref.dtype if quantized else k_ref.dtype
    read = functools.partial(tiles.read_keys, head_dim=head_dim, lanes=lanes, dtype=dtype)

    def body(step, state):
        positions = (start + step) * block_k + jnp.arange(block_k, dtype=jnp.int32)
        key_ok = (positions >= first_key) & (positions < end_key)
        pages, slots = tiles.key_pages(tables_ref, seq, positions, page_size=page_size)
        keys = read(k_ref, k_scales_ref, pages, slots, key_ok)
        values = read(v_ref, v_scales_ref, pages, slots, key_ok)
        scores = tiles.logits(q, keys, scale=scale, soft_cap=soft_cap, use_dot=True)
        mask = key_ok[None, :] & (positions[None, :] <= q_positions[:, None])
        if sliding_window is not None:
            mask &= positions[None, :] > q_positions[:, None] - sliding_window
        return tiles.online_softmax_step(state, scores, mask, values, use_dot=True)

    state = tiles.initial_state(rows, lanes)
    acc, _, row_sum = lax.fori_loop(0, jnp.maximum(stop - start, 0), body, state)
    out = tiles.normalize(acc, row_sum)
    tiles.store_rows(out_ref, out, first_row + token, heads, row_ok, head_dim=head_dim)


def _whole(array) -> pl.BlockSpec:
    """Every program sees the whole array (a pointer on the GPU)."""
    return pl.BlockSpec(array.shape, lambda *_: (0,) * array.ndim)


def _per_kv_head(array) -> pl.BlockSpec:
    """Program ``(.., h, ..)`` sees KV head h's pool ``[P, page_size, D | G]``."""
    return pl.BlockSpec((None, *array.shape[1:]), lambda _, h, *__: (h, 0, 0, 0))


def _compiler_params(interpret: bool, num_warps: int, num_stages: int):
    """Triton launch parameters unless interpreted (a kernel not interpreted runs on a GPU, or
    is lowered for one from another host, so the platform is not asked)."""
    if interpret:
        return None
    return plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def _key_bytes(pages, scales) -> int:
    """Bytes one key (or value) of one KV head takes in the pool, its scales included."""
    per_key = pages.shape[-1] * pages.dtype.itemsize
    return per_key + sum(s.shape[-1] * s.dtype.itemsize for s in scales[:1])


def _cost(q, pages, scales, *, queries: int, keys_per_query: int, key_reads: int):
    """Upper bounds (every sequence at its block table's full width): K and V bytes of
    ``key_reads`` keys per KV head, q and the output, and 4 * Hq * D flops per (query, key)."""
    num_tokens, num_heads, head_dim = q.shape
    row_bytes = num_tokens * num_heads * head_dim * q.dtype.itemsize
    return pl.CostEstimate(
        flops=4 * num_heads * head_dim * queries * keys_per_query,
        transcendentals=num_heads * queries * keys_per_query,
        bytes_accessed=2 * pages.shape[0] * key_reads * _key_bytes(pages, scales) + 2 * row_bytes,
    )


class PagedInputs(NamedTuple):
    """What both kernels read: the step's queries and the paged pool with its metadata."""

    q: jax.Array  # [T, Hq, D]
    k_pages: jax.Array  # [Hkv, P, page_size, D] (8-bit codes for an 8-bit pool)
    v_pages: jax.Array  # [Hkv, P, page_size, D]
    scales: list  # [] or [k_scales, v_scales] [Hkv, P, page_size, G]
    kv_lens: jax.Array  # [S]
    block_tables: jax.Array  # [S, W]


def _bind(kernel, paged: PagedInputs, sizes, options: dict, **extra):
    """``kernel`` with its static arguments: the group, sizes, scale, soft cap, window."""
    return functools.partial(
        kernel,
        group=paged.q.shape[1] // paged.k_pages.shape[0],
        sizes=sizes,
        scale=options["scale"],
        soft_cap=options["soft_cap"],
        sliding_window=options["sliding_window"],
        quantized=bool(paged.scales),
        **extra,
    )


def _launch(
    kernel, inputs, *, name, grid, in_specs, out_specs, out_shape, aliases, sizes, options, cost
):
    """One ``pallas_call`` of ``kernel`` over ``grid``, with its launch parameters."""
    interpret = options["interpret"]
    return pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        input_output_aliases=aliases,
        interpret=interpret,
        compiler_params=_compiler_params(interpret, sizes.num_warps, sizes.num_stages),
        cost_estimate=cost,
        name=name,
    )(*inputs)


def decode_call(
    paged: PagedInputs,
    cu_q_lens,  # [S + 1] sanitised
    out,  # [T, Hq, D] the step's output so far (one split: decode rows are written into it)
    *,
    sizes: DecodeSizes,
    decode_only: bool = False,
    **options,  # scale, soft_cap, sliding_window, interpret
):
    """The decode kernel: ``out`` with the decode rows written (one split), or the splits'
    ``(acc [N, S, Hkv, R, lanes], row_max [N, S, Hkv, R], row_sum)`` (several). A decode-only
    step (``decode_only``: one row per sequence slot, T == S) with one split writes every row
    of a new output (``out`` unused)."""
    q, k_pages, v_pages, scales, kv_lens, block_tables = paged
    num_kv_heads, _, page_size, head_dim = k_pages.shape
    max_seqs, width = block_tables.shape
    rows, lanes, splits = sizes.rows, padded_head_dim(head_dim), sizes.num_splits
    kernel = _bind(_decode_kernel, paged, sizes, options, decode_only=decode_only)
    inputs = [cu_q_lens, kv_lens, block_tables, q, k_pages, v_pages, *scales]
    in_specs = [_whole(x) for x in inputs[:4]] + [_per_kv_head(x) for x in inputs[4:]]
    aliases = {}
    if splits == 1 and decode_only:
        out_shape = jax.ShapeDtypeStruct(q.shape, q.dtype)
        out_specs = _whole(q)
    elif splits == 1:
        inputs.append(out)
        in_specs.append(_whole(out))
        aliases = {len(inputs) - 1: 0}
        out_shape = jax.ShapeDtypeStruct(out.shape, out.dtype)
        out_specs = _whole(out)
    else:
        stats = (splits, max_seqs, num_kv_heads, rows)
        out_shape = (
            jax.ShapeDtypeStruct((*stats, lanes), jnp.float32),
            jax.ShapeDtypeStruct(stats, jnp.float32),
            jax.ShapeDtypeStruct(stats, jnp.float32),
        )
        stat_spec = pl.BlockSpec((None, None, None, rows), lambda s, h, j: (j, s, h, 0))
        out_specs = (
            pl.BlockSpec((None, None, None, rows, lanes), lambda s, h, j: (j, s, h, 0, 0)),
            stat_spec,
            stat_spec,
        )
    max_keys = width * page_size
    cost = _cost(
        q, k_pages, scales, queries=max_seqs, keys_per_query=max_keys, key_reads=max_seqs * max_keys
    )
    return _launch(
        kernel,
        inputs,
        name="ragged_paged_attention_decode",
        grid=(max_seqs, num_kv_heads, splits),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        aliases=aliases,
        sizes=sizes,
        options=options,
        cost=cost,
    )


def prefill_call(
    paged: PagedInputs,
    blocks,  # [4, N] int32 per query block: sequence, first row, query count, first position
    out,  # [T, Hq, D] the step's output so far; prefill rows are written into it
    *,
    sizes: PrefillSizes,
    **options,  # scale, soft_cap, sliding_window, interpret
):
    """The prefill kernel: ``out`` with the prefill rows written."""
    q, k_pages, v_pages, scales, kv_lens, block_tables = paged
    num_kv_heads, _, page_size, _ = k_pages.shape
    num_blocks = blocks.shape[1]
    kernel = _bind(_prefill_kernel, paged, sizes, options)
    inputs = [blocks, kv_lens, block_tables, q, k_pages, v_pages, *scales, out]
    in_specs = (
        [_whole(x) for x in inputs[:4]] + [_per_kv_head(x) for x in inputs[4:-1]] + [_whole(out)]
    )
    max_keys = block_tables.shape[1] * page_size
    cost = _cost(
        q,
        k_pages,
        scales,
        queries=q.shape[0],
        keys_per_query=max_keys,
        key_reads=num_blocks * max_keys,
    )
    return _launch(
        kernel,
        inputs,
        name="ragged_paged_attention_prefill",
        grid=(num_blocks, num_kv_heads),
        in_specs=in_specs,
        out_specs=_whole(out),
        out_shape=jax.ShapeDtypeStruct(out.shape, out.dtype),
        aliases={len(inputs) - 1: 0},
        sizes=sizes,
        options=options,
        cost=cost,
    )
