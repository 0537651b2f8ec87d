"""What a program of the GPU kernels does with its query rows and each block of keys: load the
rows, read the block from the paged pool, score it and fold it into the online softmax, then
store the rows. The decode and prefill kernels share all of it; float and 8-bit pools differ only
inside :func:`read_keys` (the 8-bit codes are dequantised there, per key block, in registers).

Indexing: Triton blocks have power-of-two sizes, so a program works on ``lanes`` =
``padded_head_dim(head_dim)`` lanes. Where ``head_dim`` is a power of two the lane index is the
plain ``iota``, unmasked: Triton then sees each row's lanes as contiguous and aligned and loads
them 16 bytes at a time (a clamped or masked lane index makes every element a load of its own:
on an H200 that ran the decode kernel at a tenth of the copy bandwidth). Otherwise (head_dim 96)
the extra lanes are masked out of every load and store: loads use in-bounds indices (clamped:
the interpreter gathers them) with a mask and a fill value; stores send masked elements to an
index past the array, which the interpreter drops and the GPU never touches. Every index array
is spelled out per dimension, so the lowering computes the offsets (64-bit for pools over 4 GiB).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.kv_codes import codes_to_float, scales_to_float
from pallas_kernels.ragged_layout import MASK_VALUE


def lane_indices(head_dim: int, lanes: int):
    """``(index [lanes], valid [lanes] or None)``: lanes past ``head_dim`` are invalid and
    clamped; None (every lane valid, the plain iota) when ``head_dim == lanes``."""
    lane = jnp.arange(lanes, dtype=jnp.int32)
    if head_dim == lanes:
        return lane, None
    return jnp.minimum(lane, head_dim - 1), lane < head_dim


def row_mask(rows_ok, lane_ok, lanes: int):
    """``[R, lanes]`` mask of rows ``rows_ok`` [R] and lanes ``lane_ok`` [lanes] (None: all)."""
    mask = jnp.broadcast_to(rows_ok[:, None], (rows_ok.shape[0], lanes))
    return mask if lane_ok is None else mask & lane_ok[None, :]


def load_rows(q_ref, tokens, heads, row_ok, *, head_dim: int, lanes: int) -> jax.Array:
    """Query rows ``q_ref[tokens[r], heads[r], :head_dim]`` as ``[R, lanes]`` (zeros where
    ``row_ok`` is False and past ``head_dim``); ``tokens`` and ``heads`` in bounds."""
    lane, lane_ok = lane_indices(head_dim, lanes)
    shape = (tokens.shape[0], lanes)
    return plgpu.load(
        q_ref.at[
            jnp.broadcast_to(tokens[:, None], shape),
            jnp.broadcast_to(heads[:, None], shape),
            jnp.broadcast_to(lane[None, :], shape),
        ],
        mask=row_mask(row_ok, lane_ok, lanes),
        other=0,
    )


def store_rows(
    out_ref, values, tokens, heads, row_ok, *, head_dim: int, first_lane=0, lane_mask=None
) -> None:
    """``out_ref[tokens[r], heads[r], first_lane + l] = values[r, l]`` for rows where
    ``row_ok`` (and, with ``lane_mask``, lanes below ``head_dim``; None: masked where the
    values have more lanes than ``head_dim``). Unmasked lanes stay contiguous stores."""
    num_tokens, num_heads, _ = out_ref.shape
    rows, lanes = values.shape
    if lane_mask is None:
        lane_mask = head_dim != lanes
    lane = first_lane + jnp.arange(lanes, dtype=jnp.int32)
    lane_ok = lane < head_dim if lane_mask else None
    # Masked elements go past the array (dropped by the interpreter, untouched on the GPU), so no
    # two stores the interpreter makes share an index.
    tokens = jnp.where(row_ok, tokens, num_tokens)
    heads = jnp.where(row_ok, heads, num_heads)
    if lane_ok is not None:
        lane = jnp.where(lane_ok, lane, head_dim)
    shape = (rows, lanes)
    plgpu.store(
        out_ref.at[
            jnp.broadcast_to(tokens[:, None], shape),
            jnp.broadcast_to(heads[:, None], shape),
            jnp.broadcast_to(lane[None, :], shape),
        ],
        values.astype(out_ref.dtype),
        mask=row_mask(row_ok, lane_ok, lanes),
    )


def key_pages(tables_ref, seq, positions, *, page_size: int):
    """``(page ids [K], slots [K])`` of key ``positions`` [K] of sequence ``seq``."""
    width = tables_ref.shape[1]
    index = jnp.clip(positions // page_size, 0, width - 1)
    pages = plgpu.load(tables_ref.at[jnp.full_like(index, seq), index])
    return pages, positions % page_size


def read_keys(pages_ref, scales_ref, pages, slots, key_ok, *, head_dim: int, lanes: int, dtype):
    """Keys (or values) ``[K, lanes]`` in ``dtype`` from one KV head's pool ``pages_ref``
    ``[P, S, D]`` at ``(pages [K], slots [K])``; zeros where ``key_ok`` is False.

    ``scales_ref`` None: a float pool. Otherwise ``pages_ref`` holds 8-bit codes (int8, or fp8
    bits as uint8) and ``scales_ref`` ``[P, S, G]`` the bfloat16 bits of each key's scale per
    group of ``head_dim / G`` lanes: the codes are dequantised here, in registers."""
    lane, lane_ok = lane_indices(head_dim, lanes)
    shape = (pages.shape[0], lanes)
    values = plgpu.load(
        pages_ref.at[
            jnp.broadcast_to(pages[:, None], shape),
            jnp.broadcast_to(slots[:, None], shape),
            jnp.broadcast_to(lane[None, :], shape),
        ],
        mask=row_mask(key_ok, lane_ok, lanes),
        other=0,
    )
    if scales_ref is None:
        return values.astype(dtype)
    groups = scales_ref.shape[-1]
    scale = None
    for g in range(groups):  # G is 1 (head_dim <= 128) or 2 (256)
        bits = plgpu.load(
            scales_ref.at[pages, slots, jnp.full_like(pages, g)], mask=key_ok, other=0
        )
        group_scale = jnp.broadcast_to(scales_to_float(bits)[:, None], shape)
        in_group = jnp.broadcast_to((lane >= g * (head_dim // groups))[None, :], shape)
        scale = group_scale if scale is None else jnp.where(in_group, group_scale, scale)
    return (codes_to_float(values) * scale).astype(dtype)


def dot_precision(dtype) -> lax.Precision:
    """Full float32 matmuls for float32 inputs (Triton would otherwise use TF32)."""
    return lax.Precision.HIGHEST if dtype == jnp.float32 else lax.Precision.DEFAULT


def logits(q, keys, *, scale: float, soft_cap: float | None, use_dot: bool) -> jax.Array:
    """Scaled (and soft-capped) logits ``[R, K]`` of rows ``q`` [R, lanes] against ``keys``.

    ``use_dot``: ``tl.dot`` in the keys' dtype with float32 accumulation (``q`` cast to it).
    Otherwise no MMA: ``q`` is float32 and already scaled (see :func:`prepare_rows`), and each
    logit is a float32 sum of lane products, computed as a ``[R, K, lanes]`` block."""
    if use_dot:
        scores = lax.dot_general(
            q.astype(keys.dtype),
            keys,
            (((1,), (1,)), ((), ())),
            precision=dot_precision(keys.dtype),
            preferred_element_type=jnp.float32,
        )
        scores = scores * scale
    else:
        scores = jnp.sum(q[:, None, :] * keys.astype(jnp.float32)[None, :, :], axis=2)
    if soft_cap is not None:
        scores = soft_cap * jnp.tanh(scores / soft_cap)
    return scores


def prepare_rows(q, *, scale: float, use_dot: bool) -> jax.Array:
    """Query rows as :func:`logits` takes them: as loaded for the dot path; float32 and scaled
    once per program otherwise (as the reference scales them)."""
    return q if use_dot else q.astype(jnp.float32) * scale


def weighted_values(probs, values, *, use_dot: bool) -> jax.Array:
    """``probs [R, K] @ values [K, lanes]`` in float32: ``tl.dot`` in the values' dtype, or a
    float32 sum over keys of ``[R, K, lanes]``."""
    if use_dot:
        return lax.dot_general(
            probs.astype(values.dtype),
            values,
            (((1,), (0,)), ((), ())),
            precision=dot_precision(values.dtype),
            preferred_element_type=jnp.float32,
        )
    return jnp.sum(probs[:, :, None] * values.astype(jnp.float32)[None, :, :], axis=1)


def initial_state(rows: int, lanes: int):
    """Empty online-softmax state: ``acc [R, lanes]``, ``row_max [R]``, ``row_sum [R]``."""
    return (
        jnp.zeros((rows, lanes), jnp.float32),
        jnp.full((rows,), MASK_VALUE, jnp.float32),
        jnp.zeros((rows,), jnp.float32),
    )


def online_softmax_step(state, scores, mask, values, *, use_dot: bool):
    """Folds one key block (``scores`` [R, K], ``mask`` [R, K], ``values`` [K, lanes]) into
    ``state``. Masked keys get probability exactly 0, so a row that sees none keeps sum 0."""
    acc, max_prev, sum_prev = state
    scores = jnp.where(mask, scores, MASK_VALUE)
    max_next = jnp.maximum(max_prev, jnp.max(scores, axis=1))
    probs = jnp.where(mask, jnp.exp(scores - max_next[:, None]), 0.0)
    correction = jnp.exp(max_prev - max_next)
    sum_next = sum_prev * correction + jnp.sum(probs, axis=1)
    acc = acc * correction[:, None] + weighted_values(probs, values, use_dot=use_dot)
    return acc, max_next, sum_next


def normalize(acc, row_sum) -> jax.Array:
    """``acc / row_sum``, rows that saw no key (sum 0) as zeros."""
    safe = jnp.where(row_sum > 0, row_sum, 1.0)
    return jnp.where((row_sum > 0)[:, None], acc / safe[:, None], 0.0)
