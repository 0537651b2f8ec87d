"""Paged attention for decode: one query token per sequence, reading K/V from a page pool.

Layout shared by every kernel here:
  k_pages, v_pages: [num_kv_heads, num_pages, page_size, head_dim]
  block_tables:     [batch, pages_per_seq] int32, page indices of each sequence in order
  lengths:          [batch] int32, tokens cached per sequence (the query attends to all of them)

The Pallas kernel targets the Triton GPU lowering (see docs/kernels.md) and runs anywhere with
``interpret=True``. One program handles one (sequence, KV head, split): the query heads that
share the KV head form a ``[block_heads, head_dim]`` block that walks the sequence's pages in
compute blocks of ``pages_per_compute_block`` pages with an online softmax.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
FLOAT_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


def gather_pages(
    pages: jax.Array,  # [Hkv, P, S, D]
    block_tables: jax.Array,  # [..., W] int32, every entry a valid page id
) -> jax.Array:  # [Hkv, ..., W, S, D]
    """Gathers pages by id. Block tables only hold valid ids (padding points at page 0), so the
    gather skips bounds handling: on XLA CPU that is ~7x faster than the default clamping gather."""
    return pages.at[:, block_tables].get(mode="promise_in_bounds")


def paged_attention_reference(
    q: jax.Array,  # [B, Hq, D]
    k_pages: jax.Array,  # [Hkv, P, S, D]
    v_pages: jax.Array,  # [Hkv, P, S, D]
    lengths: jax.Array,  # [B]
    block_tables: jax.Array,  # [B, W]
    *,
    scale: float | None = None,
    soft_cap: float | None = None,
    sliding_window: int | None = None,
) -> jax.Array:  # [B, Hq, D]
    """Pure-JAX paged decode attention (the reference every kernel is checked against).

    Rows with ``lengths == 0`` return zeros.
    """
    batch, num_heads, head_dim = q.shape
    num_kv_heads, _, page_size, _ = k_pages.shape
    group = num_heads // num_kv_heads
    width = block_tables.shape[1]
    scale = head_dim**-0.5 if scale is None else scale
    k = gather_pages(k_pages, block_tables).reshape(
        num_kv_heads, batch, width * page_size, head_dim
    )
    v = gather_pages(v_pages, block_tables).reshape(
        num_kv_heads, batch, width * page_size, head_dim
    )
    qg = q.reshape(batch, num_kv_heads, group, head_dim).astype(jnp.float32) * scale
    scores = jnp.einsum("bhgd,hbld->bhgl", qg, k.astype(jnp.float32))
    if soft_cap is not None:
        scores = soft_cap * jnp.tanh(scores / soft_cap)
    key_pos = jnp.arange(width * page_size)[None, :]
    valid = key_pos < lengths[:, None]
    if sliding_window is not None:
        valid &= key_pos >= lengths[:, None] - sliding_window
    scores = jnp.where(valid[:, None, None, :], scores, MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1)
    probs = jnp.where(valid[:, None, None, :], probs, 0.0)
    out = jnp.einsum("bhgl,hbld->bhgd", probs, v.astype(jnp.float32))
    return out.reshape(batch, num_heads, head_dim).astype(q.dtype)


# ----------------------------------------------------------------------------- shared helpers


def next_power_of_2(value: int) -> int:
    """Smallest power of two >= ``value`` (1 for value <= 1)."""
    return 1 if value <= 1 else 1 << (value - 1).bit_length()


def validate_common(
    q, k_pages, v_pages, *, scale, soft_cap, sliding_window, pool_dtypes=FLOAT_DTYPES
) -> None:
    """Checks the arguments both kernels share; raises ``ValueError`` naming the argument.
    ``pool_dtypes``: the pool dtypes accepted (``EIGHT_BIT_DTYPES`` for an 8-bit pool)."""
    if q.ndim != 3:
        raise ValueError(f"q must have rank 3, got shape {q.shape}")
    if k_pages.ndim != 4:
        raise ValueError(
            f"k_pages must be [num_kv_heads, num_pages, page_size, head_dim], got {k_pages.shape}"
        )
    if v_pages.shape != k_pages.shape:
        raise ValueError(f"v_pages shape {v_pages.shape} != k_pages shape {k_pages.shape}")
    if q.dtype not in FLOAT_DTYPES:
        raise ValueError(f"q dtype must be float32, bfloat16 or float16, got {q.dtype}")
    if k_pages.dtype not in pool_dtypes or v_pages.dtype != k_pages.dtype:
        raise ValueError(
            f"k_pages and v_pages must share a dtype of {[str(d) for d in pool_dtypes]}, got "
            f"{k_pages.dtype}, {v_pages.dtype}"
        )
    num_heads, head_dim = q.shape[1:]
    num_kv_heads = k_pages.shape[0]
    if num_heads % num_kv_heads:
        raise ValueError(
            f"q heads ({num_heads}) must be a multiple of k_pages heads ({num_kv_heads})"
        )
    if k_pages.shape[3] != head_dim:
        raise ValueError(f"k_pages head_dim {k_pages.shape[3]} != q head_dim {head_dim}")
    if scale is not None and not scale > 0:
        raise ValueError(f"scale must be positive, got {scale}")
    if soft_cap is not None and not soft_cap > 0:
        raise ValueError(f"soft_cap must be positive, got {soft_cap}")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")


def validate_scales(values, k_scales, v_scales) -> None:
    """An 8-bit pool's scales: the uint16 bits of bfloat16 values, ``[Hkv, P, S, G]`` beside
    ``values`` [Hkv, P, S, D], G dividing D; raises ``ValueError`` naming the argument."""
    groups = k_scales.shape[-1] if k_scales.ndim == 4 else 0
    for name, scales in (("k_pages.scales", k_scales), ("v_pages.scales", v_scales)):
        if scales.shape != (*values.shape[:3], groups) or scales.dtype != jnp.uint16:
            raise ValueError(
                f"{name} must be uint16 (bfloat16 bits) [Hkv, P, S, G] beside values "
                f"{values.shape}, got "
                f"{scales.dtype} {scales.shape}"
            )
    if not groups or values.shape[-1] % groups:
        raise ValueError(f"{groups} scale groups must divide head_dim {values.shape[-1]}")


def validate_int_array(name: str, array: jax.Array, shape: tuple[int, ...]) -> None:
    """Raises ``ValueError`` unless ``array`` is int32 with the given shape."""
    if array.dtype != jnp.int32:
        raise ValueError(f"{name} must be int32, got {array.dtype}")
    if array.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {array.shape}")


def compiler_params(interpret: bool, num_warps: int, num_stages: int):
    """Triton compiler params unless interpreted (a kernel not interpreted runs on a GPU, or is
    lowered for one from another host, so the platform is not asked)."""
    if interpret:
        return None
    from jax.experimental.pallas import triton as plgpu

    return plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def dot_precision(dtype) -> lax.Precision:
    """Full float32 matmuls for float32 inputs (Triton would otherwise use TF32)."""
    return lax.Precision.HIGHEST if dtype == jnp.float32 else lax.Precision.DEFAULT


def online_softmax_step(carry, q, k, v, mask, *, scale, soft_cap):
    """One flash-attention update of ``(acc, row_max, row_sum)`` with a key/value block.

    Args:
      carry: ``acc [R, D]`` f32 unnormalised output, ``row_max [R]``, ``row_sum [R]``.
      q: ``[R, D]`` query rows; k, v: ``[K, D]`` keys and values; mask: ``[R, K]`` bool.
      scale: logit scale; soft_cap: optional logit cap applied after scaling.
    """
    acc, max_prev, sum_prev = carry
    q = q.astype(k.dtype)  # Triton matmuls need matching operand dtypes
    precision = dot_precision(k.dtype)
    scores = lax.dot_general(
        q, k, (((1,), (1,)), ((), ())), precision=precision, preferred_element_type=jnp.float32
    )
    scores = scores * scale
    if soft_cap is not None:
        scores = soft_cap * jnp.tanh(scores / soft_cap)
    scores = jnp.where(mask, scores, MASK_VALUE)
    max_next = jnp.maximum(max_prev, jnp.max(scores, axis=1))
    probs = jnp.where(mask, jnp.exp(scores - max_next[:, None]), 0.0)
    correction = jnp.exp(max_prev - max_next)
    sum_next = sum_prev * correction + jnp.sum(probs, axis=1)
    pv = lax.dot_general(
        probs.astype(v.dtype),
        v,
        (((1,), (0,)), ((), ())),
        precision=precision,
        preferred_element_type=jnp.float32,
    )
    return acc * correction[:, None] + pv, max_next, sum_next


def initial_carry(rows: int, head_dim: int):
    """Empty online-softmax state for ``rows`` query rows."""
    acc = jnp.zeros((rows, head_dim), jnp.float32)
    row_max = jnp.full((rows,), MASK_VALUE, jnp.float32)
    return acc, row_max, jnp.zeros((rows,), jnp.float32)


def normalize(acc: jax.Array, row_sum: jax.Array) -> jax.Array:
    """``acc / row_sum`` with rows that saw no key (``row_sum == 0``) set to zero."""
    safe = jnp.where(row_sum > 0, row_sum, 1.0)
    return jnp.where((row_sum > 0)[:, None], acc / safe[:, None], 0.0)


# ----------------------------------------------------------------------------- decode kernel


def _decode_kernel(
    lengths_ref,  # [B] whole array
    block_tables_ref,  # [W_padded] this sequence's pages
    q_ref,  # [block_heads, D]
    k_pages_ref,  # [P, S, D] this KV head's pool
    v_pages_ref,  # [P, S, D]
    out_ref,  # [block_heads, D]: normalised (one split) or unnormalised f32 (several)
    *stat_refs,  # several splits only: m_ref, l_ref [block_heads]
    scale: float,
    soft_cap: float | None,
    sliding_window: int | None,
    pages_per_compute_block: int,
    blocks_per_split: int,
):
    block_heads, head_dim = q_ref.shape
    page_size = k_pages_ref.shape[1]
    block_k = pages_per_compute_block * page_size
    total_blocks = block_tables_ref.shape[0] // pages_per_compute_block
    length = jnp.maximum(lengths_ref[pl.program_id(0)], 0)
    end_block = jnp.minimum((length + block_k - 1) // block_k, total_blocks)
    start_block = 0
    if sliding_window is not None:
        start_block = jnp.maximum(length - sliding_window, 0) // block_k
    split_start = pl.program_id(2) * blocks_per_split
    first_block = jnp.maximum(start_block, split_start)
    last_block = jnp.minimum(end_block, split_start + blocks_per_split)
    q = q_ref[...]

    def body(step, carry):
        block = first_block + step
        page_ids = block_tables_ref[pl.ds(block * pages_per_compute_block, pages_per_compute_block)]
        k = k_pages_ref[page_ids].reshape(block_k, head_dim)
        v = v_pages_ref[page_ids].reshape(block_k, head_dim)
        key_pos = block * block_k + jnp.arange(block_k, dtype=jnp.int32)
        valid = key_pos < length
        if sliding_window is not None:
            valid &= key_pos >= length - sliding_window
        mask = jnp.broadcast_to(valid[None, :], (block_heads, block_k))
        return online_softmax_step(carry, q, k, v, mask, scale=scale, soft_cap=soft_cap)

    num_steps = jnp.maximum(last_block - first_block, 0)
    carry = initial_carry(block_heads, head_dim)
    acc, row_max, row_sum = lax.fori_loop(0, num_steps, body, carry)
    if stat_refs:
        max_ref, sum_ref = stat_refs
        out_ref[...] = acc
        max_ref[...] = row_max
        sum_ref[...] = row_sum
    else:
        out_ref[...] = normalize(acc, row_sum).astype(out_ref.dtype)


def _combine_splits(acc, row_max, row_sum):
    """Merges per-split partial results: acc [N, ..., R, D], row_max and row_sum [N, ..., R]."""
    overall_max = jnp.max(row_max, axis=0)
    weight = jnp.exp(row_max - overall_max[None])
    total = jnp.sum(row_sum * weight, axis=0)
    out = jnp.sum(acc * weight[..., None], axis=0)
    safe = jnp.where(total > 0, total, 1.0)
    return jnp.where((total > 0)[..., None], out / safe[..., None], 0.0)


def default_pages_per_compute_block(page_size: int, pages_per_seq: int) -> int:
    """About 128 keys per compute block, a power of two, no more than the sequence's pages."""
    return min(max(1, 128 // page_size), next_power_of_2(pages_per_seq))


@functools.partial(
    jax.jit,
    static_argnames=(
        "scale",
        "soft_cap",
        "sliding_window",
        "interpret",
        "pages_per_compute_block",
        "num_splits",
        "num_warps",
        "num_stages",
    ),
)
def paged_attention(
    q: jax.Array,  # [B, Hq, D]
    k_pages: jax.Array,  # [Hkv, P, S, D]
    v_pages: jax.Array,  # [Hkv, P, S, D]
    lengths: jax.Array,  # [B]
    block_tables: jax.Array,  # [B, W]
    *,
    scale: float | None = None,
    soft_cap: float | None = None,
    sliding_window: int | None = None,
    interpret: bool = False,
    pages_per_compute_block: int | None = None,
    num_splits: int | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
) -> jax.Array:  # [B, Hq, D]
    """Pallas paged decode attention: one query token per sequence against its cached pages.

    Args:
      q: ``[batch, num_heads, head_dim]`` query of each sequence's newest token.
      k_pages: ``[num_kv_heads, num_pages, page_size, head_dim]`` key pool.
      v_pages: value pool, same shape and dtype as ``k_pages``.
      lengths: ``[batch]`` int32 tokens cached per sequence; 0 gives a zero output row.
      block_tables: ``[batch, pages_per_seq]`` int32 page ids of each sequence, in order.
      scale: logit scale, ``head_dim ** -0.5`` when None.
      soft_cap: if set, logits become ``soft_cap * tanh(logits / soft_cap)`` after scaling.
      sliding_window: if set, only the last ``sliding_window`` keys are attended to.
      interpret: run the kernel in the Pallas interpreter (needed on CPU).
      pages_per_compute_block: pages per key block (power of two); about 128 keys when None.
      num_splits: key-range splits per sequence (flash-decoding); when None, enough splits to
        give about 128 programs. Splits are merged outside the kernel.
      num_warps, num_stages: Triton launch parameters (GPU only).

    Returns:
      ``[batch, num_heads, head_dim]`` attention output in ``q.dtype``.
    """
    validate_common(
        q, k_pages, v_pages, scale=scale, soft_cap=soft_cap, sliding_window=sliding_window
    )
    batch, num_heads, head_dim = q.shape
    num_kv_heads, _, page_size, _ = k_pages.shape
    if block_tables.ndim != 2 or block_tables.shape[0] != batch:
        raise ValueError(f"block_tables must be [{batch}, pages_per_seq], got {block_tables.shape}")
    validate_int_array("block_tables", block_tables, block_tables.shape)
    validate_int_array("lengths", lengths, (batch,))
    pages_per_seq = block_tables.shape[1]
    if pages_per_compute_block is None:
        pages_per_compute_block = default_pages_per_compute_block(page_size, pages_per_seq)
    if pages_per_compute_block < 1:
        raise ValueError(f"pages_per_compute_block must be >= 1, got {pages_per_compute_block}")
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")

    if batch == 0 or pages_per_seq == 0:
        return jnp.zeros_like(q)
    group = num_heads // num_kv_heads
    block_heads = max(16, next_power_of_2(group))  # Triton dots need at least 16 rows
    total_blocks = -(-pages_per_seq // pages_per_compute_block)
    if num_splits is None:
        num_splits = max(1, 128 // (batch * num_kv_heads))
    num_splits = min(num_splits, total_blocks)
    blocks_per_split = -(-total_blocks // num_splits)
    num_splits = -(-total_blocks // blocks_per_split)
    padded_width = total_blocks * pages_per_compute_block
    block_tables = jnp.pad(block_tables, ((0, 0), (0, padded_width - pages_per_seq)))
    q_blocks = q.reshape(batch, num_kv_heads, group, head_dim)
    q_blocks = jnp.pad(q_blocks, ((0, 0), (0, 0), (0, block_heads - group), (0, 0)))

    kernel = functools.partial(
        _decode_kernel,
        scale=head_dim**-0.5 if scale is None else scale,
        soft_cap=soft_cap,
        sliding_window=sliding_window,
        pages_per_compute_block=pages_per_compute_block,
        blocks_per_split=blocks_per_split,
    )
    pool_spec = pl.BlockSpec((None, *k_pages.shape[1:]), lambda b, h, s: (h, 0, 0, 0))
    in_specs = [
        pl.BlockSpec((batch,), lambda b, h, s: (0,)),
        pl.BlockSpec((None, padded_width), lambda b, h, s: (b, 0)),
        pl.BlockSpec((None, None, block_heads, head_dim), lambda b, h, s: (b, h, 0, 0)),
        pool_spec,
        pool_spec,
    ]
    out_block = (batch, num_kv_heads, block_heads)
    if num_splits == 1:
        out_shape = jax.ShapeDtypeStruct((*out_block, head_dim), q.dtype)
        out_specs = pl.BlockSpec((None, None, block_heads, head_dim), lambda b, h, s: (b, h, 0, 0))
    else:
        stat_spec = pl.BlockSpec((None, None, None, block_heads), lambda b, h, s: (s, b, h, 0))
        out_shape = (
            jax.ShapeDtypeStruct((num_splits, *out_block, head_dim), jnp.float32),
            jax.ShapeDtypeStruct((num_splits, *out_block), jnp.float32),
            jax.ShapeDtypeStruct((num_splits, *out_block), jnp.float32),
        )
        out_specs = (
            pl.BlockSpec(
                (None, None, None, block_heads, head_dim), lambda b, h, s: (s, b, h, 0, 0)
            ),
            stat_spec,
            stat_spec,
        )
    result = pl.pallas_call(
        kernel,
        grid=(batch, num_kv_heads, num_splits),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        interpret=interpret,
        compiler_params=compiler_params(interpret, num_warps, num_stages),
        name="paged_decode_attention",
    )(lengths, block_tables, q_blocks, k_pages, v_pages)
    out = result if num_splits == 1 else _combine_splits(*result)
    return out[:, :, :group].reshape(batch, num_heads, head_dim).astype(q.dtype)
