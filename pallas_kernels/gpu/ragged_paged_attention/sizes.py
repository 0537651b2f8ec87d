"""Block sizes, launch parameters and the decode split count of the GPU ragged paged-attention
kernels, chosen from static shapes only (so one compile per shape bucket), each with its reason.

Measured on an NVIDIA H200 by the device check (commit d2b7523; docs/gpu.md has the tables and
docs/measurements/ the JSON); every size can be overridden through the wrapper's tuning
arguments.

Why these numbers:
- Triton tensors have power-of-two sizes, so a head_dim such as 96 is computed on 128 lanes
  (``padded_head_dim``; the extra lanes are masked out of every load and store) and a GQA group
  of 3 or 6 on 4 or 8 rows.
- Decode scores keys with ``tl.dot`` (the MMA units) by default, the group padded to 16 rows
  (``tl.dot``'s minimum; Llama-3's group of 4 gives 16 rows, not the 64 of the earlier kernel).
  Decode is memory-bound, so the padded rows cost MMA work the step has to spare; what decided
  on the device is how the key blocks are read. Compiled offline for sm_90, the dot path's
  decode kernel copies each block into shared memory with 16-byte ``cp.async`` copies, which
  Triton pipelines (``num_stages``); the lane-sum path (a float32 multiply and sum over
  ``[rows, block_k, lanes]``, ``DECODE_PRODUCTS`` bounding the products to what fits in
  registers) loads straight into registers, with no ``cp.async`` and nothing pipelined.
  On the H200, batch 64 x 4k keys: the dot path 335 us a call (just under 75% of the copy bandwidth), the
  lane-sum path 2,829 us (9%); batch 1 x 32k keys: 54 us (58%) against 360 us (9%). The lane-sum
  path stays as ``decode_dot=False``.
- Decode key blocks of 64 keys (the dot path): against 32, 64 measured 2% faster at batch 64 x
  4k (77% of copy against 75%) and 4% faster at batch 1 x 32k (60% against 58%) in the d2b7523
  run; small margins, but the same way at both shapes, so 64 is the default and 32 is among the
  variants the device check times beside it. 3 stages instead of 2 came within 1.5% either way.
- Decode-only steps (the engine marks them: one row per sequence slot, no prefill rows) run the
  decode kernel and the split merge alone: no prefill kernel (its empty grid took 0.085 ms of
  the batch-1 step, 32 layers), no zeroed output and no scatter of the merged rows (the merge,
  two XLA reductions and a scatter a layer, took 0.21 ms; without the scatter the merged rows
  are the output). A merge written as a Pallas kernel, one program per (slot, KV head) walking
  its splits, was slower than XLA's reductions (batch 1 x 32k keys: 75 us a call, 075a864).
- Split-KV for decode: one program per (sequence slot, KV head) leaves most of the GPU idle when
  there are few sequences (batch 1 at 8 KV heads: 8 programs on 132 SMs, each walking its whole
  context). Each (sequence, KV head) is cut into ``num_splits`` contiguous key ranges, one per
  program, merged afterwards by log-sum-exp. The count is static: enough programs for
  ``PROGRAMS_PER_SM`` per SM of an H100/H200 (132 SMs) over the step's sequence slots, and no
  more splits than key blocks in a full block table. Each sequence's own length is cut into that
  many ranges at run time, so short sequences are split as finely as long ones. Measured at
  batch 1 x 32k: 66 splits (the default for one sequence slot, 528 programs) 54 us, 16 splits
  104 us, 4 splits 362 us; at batch 64 x 4k, where the default is 1 split (512 programs), 4 and
  16 splits were 5% and 8.5% slower.
- Prefill (rows with more than one query): query blocks of 128 rows (tokens x the group's heads)
  for head_dim up to 128, 64 rows at 256 (the float32 accumulator is rows x lanes), against key
  blocks of 64 (32 at 256) keys; 8 warps for the larger tiles, as FlashAttention's Triton
  kernels use on Hopper. These are not timed apart by the device check yet (its prefill is
  measured inside the engine's steps only).
"""

from __future__ import annotations

import dataclasses

NUM_SMS = 132  # H100 SXM5 and H200
PROGRAMS_PER_SM = 4
MIN_DOT_SIZE = 16  # tl.dot: every dimension at least 16
# Decode on the MMA path unless decode_dot=False: on an H200 it ran 8.4x faster than the
# lane-sum path at batch 64 x 4k keys (d2b7523; 3.7x before the lane fix, f075695).
DECODE_DOT_DEFAULT = True
DECODE_BLOCK_K = 64  # keys per decode block on the dot path
DECODE_PRODUCTS = 8192  # [rows, block_k, lanes] float32 products of one non-MMA score block
MAX_HEAD_DIM = 256  # the largest head_dim whose accumulator and tiles fit a program
# The decode splits merged by XLA's three reductions until the one-kernel Pallas merge
# (merge.py) is timed on a GPU beside them (the device check times both).
PALLAS_MERGE_DEFAULT = False


def next_power_of_2(value: int) -> int:
    """Smallest power of two >= ``value`` (1 for value <= 1)."""
    return 1 if value <= 1 else 1 << (value - 1).bit_length()


def is_power_of_2(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


def padded_head_dim(head_dim: int) -> int:
    """Lanes a head is computed on: a power of two, at least 16 for ``tl.dot``."""
    return max(MIN_DOT_SIZE, next_power_of_2(head_dim))


@dataclasses.dataclass(frozen=True)
class DecodeSizes:
    """One decode program: ``rows`` query rows (the KV head's group, padded) against
    ``block_k`` keys at a time, over one of ``num_splits`` ranges of its sequence."""

    use_dot: bool
    rows: int
    block_k: int
    num_splits: int
    num_warps: int
    num_stages: int


@dataclasses.dataclass(frozen=True)
class PrefillSizes:
    """One prefill program: ``block_q`` tokens x the padded group = ``rows`` query rows against
    ``block_k`` keys at a time."""

    block_q: int
    rows: int
    block_k: int
    num_warps: int
    num_stages: int


def _check_power_of_2(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not is_power_of_2(value)):
        raise ValueError(f"{name} must be a power of two >= 1, got {value!r}")


def decode_sizes(
    *,
    group: int,
    head_dim: int,
    max_seqs: int,
    num_kv_heads: int,
    max_keys: int,
    use_dot: bool | None = None,
    num_splits: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> DecodeSizes:
    """Decode sizes for ``max_seqs`` sequence slots of at most ``max_keys`` keys (the block
    table's width in keys); the keyword overrides are the wrapper's tuning arguments."""
    _check_power_of_2("decode_block_k", block_k)
    if num_splits is not None and (isinstance(num_splits, bool) or num_splits < 1):
        raise ValueError(f"num_splits must be an integer >= 1, got {num_splits!r}")
    padded_group = next_power_of_2(group)
    lanes = padded_head_dim(head_dim)
    if use_dot is None:
        use_dot = DECODE_DOT_DEFAULT
    rows = max(MIN_DOT_SIZE, padded_group) if use_dot else padded_group
    if block_k is None:
        block_k = DECODE_BLOCK_K if use_dot else max(8, min(64, DECODE_PRODUCTS // (rows * lanes)))
    if use_dot and block_k < MIN_DOT_SIZE:
        raise ValueError(f"decode_block_k must be >= 16 on the dot path, got {block_k}")
    key_blocks = max(1, -(-max_keys // block_k))
    if num_splits is None:
        num_splits = max(1, NUM_SMS * PROGRAMS_PER_SM // max(1, max_seqs * num_kv_heads))
    num_splits = min(num_splits, key_blocks)
    return DecodeSizes(
        use_dot=bool(use_dot),
        rows=rows,
        block_k=block_k,
        num_splits=num_splits,
        num_warps=num_warps or 4,
        num_stages=num_stages or 2,
    )


def prefill_sizes(
    *,
    group: int,
    head_dim: int,
    block_q: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> PrefillSizes:
    """Prefill sizes; the keyword overrides are the wrapper's tuning arguments."""
    _check_power_of_2("prefill_block_q", block_q)
    _check_power_of_2("prefill_block_k", block_k)
    padded_group = next_power_of_2(group)
    lanes = padded_head_dim(head_dim)
    if block_q is None:
        block_q = max(1, (128 if lanes <= 128 else 64) // padded_group)
    rows = block_q * padded_group
    if rows < MIN_DOT_SIZE:
        raise ValueError(
            f"prefill_block_q={block_q} gives {rows} query rows (x {padded_group} heads); "
            f"tl.dot needs at least {MIN_DOT_SIZE}"
        )
    if block_k is None:
        block_k = 64 if lanes <= 128 else 32
    if block_k < MIN_DOT_SIZE:
        raise ValueError(f"prefill_block_k must be >= 16, got {block_k}")
    return PrefillSizes(
        block_q=block_q,
        rows=rows,
        block_k=block_k,
        num_warps=num_warps or (8 if rows * lanes >= 128 * 128 else 4),
        num_stages=num_stages or 3,
    )
