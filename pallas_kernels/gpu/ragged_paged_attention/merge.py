"""The decode splits' log-sum-exp merge as one Pallas Triton kernel (``pallas_merge=True``).

XLA merges the splits in three small reductions a call (the max over the splits, then the two
weighted sums), each a short grid bound by latency: about 8 us of a batch-1 call over 32k keys
and 4.4 us a layer of a batch-1 engine step on an H200 (a418dfe), where the decode kernel itself
takes 38 and 6 us. Here one launch does it: grid ``(sequence slot, KV head, lane chunk)``, each
program loading every split of its rows at once (``[splits, group rows, lane chunk]``, the
splits padded to a power of two and masked), so no program walks the splits one by one (the
Pallas merge tried at 075a864, one program per slot and head looping over its splits, took 75 us
at 1 x 32k). Only the group's rows are read (padded to a power of two: 4 of the 16 a program
of the decode kernel stores for Llama-3's group of 4).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.gpu.ragged_paged_attention import tiles
from pallas_kernels.gpu.ragged_paged_attention.sizes import next_power_of_2
from pallas_kernels.ragged_layout import MASK_VALUE

# Float32 elements of one program's [splits, rows, lane chunk] block: 64 registers a thread at 4
# warps, as the decode kernel's lane-sum path allows itself.
MERGE_ELEMENTS = 8192
MERGE_NUM_WARPS = 4


def merge_lane_chunk(num_splits: int, group_rows: int, lanes: int) -> int:
    """Lanes one merge program takes: ``lanes`` (a power of two) halved until its block
    ``[splits padded, group_rows, chunk]`` holds at most ``MERGE_ELEMENTS`` elements."""
    per_lane = next_power_of_2(num_splits) * group_rows
    chunk = lanes
    while chunk > 1 and chunk * per_lane > MERGE_ELEMENTS:
        chunk //= 2
    return chunk


def _merge_kernel(
    cu_q_lens_ref,  # [S + 1] sanitised
    acc_ref,  # [N, R, lanes] this (slot, KV head)'s splits
    max_ref,  # [N, R]
    sum_ref,  # [N, R]
    *refs,  # a mixed step: the output passed in (unused); out_ref [T, Hq, D]
    group: int,
    head_dim: int,
    num_splits: int,
    chunk: int,
    decode_only: bool,
):
    """One (slot, KV head, lane chunk): ``out = sum_n w_n acc_n / sum_n w_n sum_n`` with
    ``w_n = exp(max_n - max over n)``; zeros where no split saw a key. The rows go straight
    into the step's output, in its dtype, where the decode kernel would have put them."""
    out_ref = refs[-1]
    num_tokens = out_ref.shape[0]
    group_rows = next_power_of_2(group)
    seq, kv_head = pl.program_id(0), pl.program_id(1)
    split = jnp.arange(next_power_of_2(num_splits), dtype=jnp.int32)
    split_ok = split < num_splits
    split = jnp.minimum(split, num_splits - 1)  # in bounds: the interpreter gathers them
    row = jnp.arange(group_rows, dtype=jnp.int32)
    first_lane = pl.program_id(2) * chunk
    # Loads stay in the padded lanes (the decode kernel's acc holds them, as zeros).
    lane = first_lane + jnp.arange(chunk, dtype=jnp.int32)
    stats_shape = (split.shape[0], group_rows)
    stats_index = (
        jnp.broadcast_to(split[:, None], stats_shape),
        jnp.broadcast_to(row[None, :], stats_shape),
    )
    stats_ok = jnp.broadcast_to(split_ok[:, None], stats_shape)
    row_max = plgpu.load(max_ref.at[stats_index], mask=stats_ok, other=MASK_VALUE)
    row_sum = plgpu.load(sum_ref.at[stats_index], mask=stats_ok, other=0.0)
    acc_shape = (*stats_shape, chunk)
    acc = plgpu.load(
        acc_ref.at[
            jnp.broadcast_to(split[:, None, None], acc_shape),
            jnp.broadcast_to(row[None, :, None], acc_shape),
            jnp.broadcast_to(lane[None, None, :], acc_shape),
        ],
        mask=jnp.broadcast_to(split_ok[:, None, None], acc_shape),
        other=0.0,
    )  # [N, G', C]
    top = jnp.max(row_max, axis=0)  # [G']
    weight = jnp.exp(row_max - top[None, :])  # [N, G']; an empty split's sum and acc are 0
    total = jnp.sum(row_sum * weight, axis=0)  # [G']
    out = jnp.sum(acc * weight[:, :, None], axis=0)  # [G', C]
    seen = total > 0
    out = jnp.where(seen[:, None], out / jnp.where(seen, total, 1.0)[:, None], 0.0)

    row_ok = row < group
    if decode_only:  # one row per sequence slot: row seq, whatever the slot holds
        token = seq
    else:  # the sequence's one query row, if it is a decode sequence
        token = jnp.minimum(cu_q_lens_ref[seq], num_tokens - 1)
        row_ok &= cu_q_lens_ref[seq + 1] - cu_q_lens_ref[seq] == 1
    tiles.store_rows(
        out_ref,
        out,
        jnp.full((group_rows,), token, jnp.int32),
        kv_head * group + jnp.minimum(row, group - 1),
        row_ok,
        head_dim=head_dim,
        first_lane=first_lane,
        lane_mask=head_dim % chunk != 0,
    )


def merge_splits_kernel(
    acc, row_max, row_sum, cu_q_lens, out, *, group: int, decode_only: bool, interpret: bool
) -> jax.Array:
    """The decode kernel's splits ``acc [N, S, Hkv, R, lanes]``, ``row_max`` / ``row_sum [N, S,
    Hkv, R]`` merged into the step's output ``[T, Hq, D]``: ``out`` (a mixed step; its decode
    rows written, the rest kept) or, ``decode_only`` (``out`` a ``ShapeDtypeStruct``), a new
    array whose row s is slot s's (zeros for a slot without keys)."""
    num_splits, max_seqs, num_kv_heads, rows, lanes = acc.shape
    head_dim = out.shape[2]
    group_rows = min(rows, next_power_of_2(group))
    chunk = merge_lane_chunk(num_splits, group_rows, lanes)
    kernel = functools.partial(
        _merge_kernel,
        group=group,
        head_dim=head_dim,
        num_splits=num_splits,
        chunk=chunk,
        decode_only=decode_only,
    )
    stats_spec = pl.BlockSpec((num_splits, None, None, rows), lambda s, h, c: (0, s, h, 0))
    whole_out = pl.BlockSpec(out.shape, lambda *_: (0, 0, 0))
    inputs = [cu_q_lens, acc, row_max, row_sum]
    in_specs = [
        pl.BlockSpec(cu_q_lens.shape, lambda *_: (0,)),
        pl.BlockSpec((num_splits, None, None, rows, lanes), lambda s, h, c: (0, s, h, 0, 0)),
        stats_spec,
        stats_spec,
    ]
    aliases = {}
    if not decode_only:
        inputs.append(out)
        in_specs.append(whole_out)
        aliases = {len(inputs) - 1: 0}
    elements = num_splits * max_seqs * num_kv_heads * group_rows
    return pl.pallas_call(
        kernel,
        grid=(max_seqs, num_kv_heads, -(-head_dim // chunk)),
        in_specs=in_specs,
        out_specs=whole_out,
        out_shape=jax.ShapeDtypeStruct(out.shape, out.dtype),
        input_output_aliases=aliases,
        interpret=interpret,
        compiler_params=None
        if interpret
        else plgpu.CompilerParams(num_warps=MERGE_NUM_WARPS, num_stages=1),
        cost_estimate=pl.CostEstimate(
            flops=3 * elements * head_dim,
            transcendentals=elements,
            bytes_accessed=4 * elements * (head_dim + 2)
            + max_seqs * num_kv_heads * group * head_dim * out.dtype.itemsize,
        ),
        name="ragged_paged_attention_merge",
    )(*inputs)
