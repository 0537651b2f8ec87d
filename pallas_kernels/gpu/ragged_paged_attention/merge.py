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

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

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


def _merge_kernel(acc_ref, max_ref, sum_ref, out_ref, *, num_splits: int, chunk: int):
    """One (slot, KV head, lane chunk): ``out = sum_n w_n acc_n / sum_n w_n sum_n`` with
    ``w_n = exp(max_n - max over n)``; zeros where no split saw a key."""
    group_rows = out_ref.shape[0]
    split = jnp.arange(next_power_of_2(num_splits), dtype=jnp.int32)
    split_ok = split < num_splits
    split = jnp.minimum(split, num_splits - 1)  # in bounds: the interpreter gathers them
    row = jnp.arange(group_rows, dtype=jnp.int32)
    lane = pl.program_id(2) * chunk + jnp.arange(chunk, dtype=jnp.int32)
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
    )  # [N, G, C]
    top = jnp.max(row_max, axis=0)  # [G]
    weight = jnp.exp(row_max - top[None, :])  # [N, G]; an empty split's sum and acc are 0
    total = jnp.sum(row_sum * weight, axis=0)  # [G]
    out = jnp.sum(acc * weight[:, :, None], axis=0)  # [G, C]
    seen = total > 0
    out = jnp.where(seen[:, None], out / jnp.where(seen, total, 1.0)[:, None], 0.0)
    out_shape = (group_rows, chunk)
    plgpu.store(
        out_ref.at[
            jnp.broadcast_to(row[:, None], out_shape), jnp.broadcast_to(lane[None, :], out_shape)
        ],
        out,
    )


def merge_splits_kernel(acc, row_max, row_sum, *, group: int, interpret: bool) -> jax.Array:
    """``acc [N, S, Hkv, R, lanes]``, ``row_max`` / ``row_sum [N, S, Hkv, R]`` (the decode
    kernel's splits) -> ``[S, Hkv, G', lanes]`` float32, the first ``group`` of the ``G' =
    next_power_of_2(group)`` rows the group's own."""
    num_splits, max_seqs, num_kv_heads, rows, lanes = acc.shape
    group_rows = min(rows, next_power_of_2(group))
    chunk = merge_lane_chunk(num_splits, group_rows, lanes)
    stats_spec = pl.BlockSpec((num_splits, None, None, rows), lambda s, h, c: (0, s, h, 0))
    elements = num_splits * max_seqs * num_kv_heads * group_rows
    return pl.pallas_call(
        lambda *refs: _merge_kernel(*refs, num_splits=num_splits, chunk=chunk),
        grid=(max_seqs, num_kv_heads, lanes // chunk),
        in_specs=[
            pl.BlockSpec((num_splits, None, None, rows, lanes), lambda s, h, c: (0, s, h, 0, 0)),
            stats_spec,
            stats_spec,
        ],
        out_specs=pl.BlockSpec((None, None, group_rows, lanes), lambda s, h, c: (s, h, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((max_seqs, num_kv_heads, group_rows, lanes), jnp.float32),
        interpret=interpret,
        compiler_params=None
        if interpret
        else plgpu.CompilerParams(num_warps=MERGE_NUM_WARPS, num_stages=1),
        cost_estimate=pl.CostEstimate(
            flops=3 * elements * lanes,
            transcendentals=elements,
            bytes_accessed=4
            * (elements * (lanes + 2) + max_seqs * num_kv_heads * group_rows * lanes),
        ),
        name="ragged_paged_attention_merge",
    )(acc, row_max, row_sum)
