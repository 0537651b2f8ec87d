"""RoPE (rotate-half, as HF Llama) on a step's queries or keys in one pass through VMEM.

XLA splits the rotation into several fusions around a float32 copy of ``x`` in another layout
(the two halves, a concatenation, the casts): on Llama-3-8B's 8 query heads per chip of v5e-4 at
64 rows, ``cost_analysis`` counts 2.5 MB where the rotation reads 131 KB and writes as much.
This kernel reads ``x`` once and writes it once: each 128-lane chunk of ``x`` (one head, or
several heads of 64 or 32 lanes) is turned to float32, its halves swapped by two lane rotations
(``pltpu.roll``) and a select, and ``x * cos + swapped * sin`` written back, where the tables
hold ``[cos, cos]`` and ``[-sin, sin]`` per head. These are the reference's products and sums
(``x1 * cos - x2 * sin == x1 * cos + x2 * (-sin)``); a compiler that fuses a multiply-add may
round the last digit differently.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.tpu.tiling import LANES

BLOCK_BYTES = 2 * 2**20  # of x per grid step


def rotary_embedding_supported(num_heads: int, head_dim: int) -> bool:
    """Whether the kernel takes ``[T, num_heads, head_dim]``: heads that tile 128 lanes (32,
    64 or 128 dims, or multiples of 128); a row may end in a part of a 128-lane chunk."""
    fits = LANES % head_dim == 0 if head_dim <= LANES else head_dim % LANES == 0
    return head_dim % 2 == 0 and fits


def rotary_embedding_tables(
    cos: jax.Array,  # [T, D / 2] float32
    sin: jax.Array,  # [T, D / 2] float32
    chunk: int,
) -> tuple[jax.Array, jax.Array]:  # [T, chunk] float32 each
    """Per-row tables over one chunk of lanes: ``[cos, cos]`` and ``[-sin, sin]`` per head,
    repeated for each head the chunk holds."""
    head_dim = 2 * cos.shape[-1]
    cos_full = jnp.concatenate([cos, cos], axis=-1)
    sin_signed = jnp.concatenate([-sin, sin], axis=-1)
    repeats = chunk // head_dim
    return jnp.tile(cos_full, (1, repeats)), jnp.tile(sin_signed, (1, repeats))


def _kernel(x_ref, cos_ref, sin_ref, out_ref, *, head_dim: int, chunk: int):
    # x_ref, out_ref: [R, H * D]; cos_ref, sin_ref: [R, chunk] float32.
    half = head_dim // 2
    cos, sin = cos_ref[...], sin_ref[...]
    rows = cos.shape[0]
    first_half = jax.lax.broadcasted_iota(jnp.int32, (rows, chunk), 1) % head_dim < half
    for start in range(0, x_ref.shape[1], chunk):
        width = min(chunk, x_ref.shape[1] - start)
        x = x_ref[:, start : start + width].astype(jnp.float32)
        ahead = pltpu.roll(x, width - half, 1)  # lane j: x[j + half] (wrapping in the chunk)
        if width == head_dim:
            swapped = ahead  # one head per chunk: both rotations agree
        else:
            swapped = jnp.where(first_half[:, :width], ahead, pltpu.roll(x, half, 1))
        out = x * cos[:, :width] + swapped * sin[:, :width]
        out_ref[:, start : start + width] = out.astype(out_ref.dtype)


def rotary_embedding_tpu(
    x: jax.Array,  # [T, H, D]
    cos: jax.Array,  # [T, D / 2] float32
    sin: jax.Array,  # [T, D / 2] float32
    *,
    interpret=False,
) -> jax.Array:  # [T, H, D], x's dtype
    """``x`` rotated by its rows' angles (module docstring). ``interpret``: False, or
    ``pltpu.InterpretParams`` to run on CPU."""
    if x.ndim != 3:
        raise ValueError(f"x must be [T, H, D], got {x.shape}")
    tokens, num_heads, head_dim = x.shape
    if cos.shape != (tokens, head_dim // 2) or sin.shape != cos.shape:
        raise ValueError(
            f"cos and sin must be [{tokens}, {head_dim // 2}] for x {x.shape}, got "
            f"{cos.shape} and {sin.shape}"
        )
    if not rotary_embedding_supported(num_heads, head_dim):
        raise ValueError(
            f"x {x.shape}: the kernel needs heads that tile 128 lanes "
            "(rotary_embedding_supported); use the jnp rotation"
        )
    width, itemsize = num_heads * head_dim, x.dtype.itemsize
    chunk = max(head_dim, LANES)
    cos_full, sin_signed = rotary_embedding_tables(
        cos.astype(jnp.float32), sin.astype(jnp.float32), chunk
    )
    rows = max(16, BLOCK_BYTES // (width * itemsize) // 16 * 16)
    rows = tokens if tokens <= rows else rows
    x2 = x.reshape(tokens, width)
    cost = pl.CostEstimate(
        flops=3 * tokens * width,
        transcendentals=0,
        bytes_accessed=2 * tokens * width * itemsize + 2 * tokens * chunk * 4,
    )
    out = pl.pallas_call(
        functools.partial(_kernel, head_dim=head_dim, chunk=chunk),
        grid=(pl.cdiv(tokens, rows),),
        in_specs=[
            pl.BlockSpec((rows, width), lambda i: (i, 0)),
            pl.BlockSpec((rows, chunk), lambda i: (i, 0)),
            pl.BlockSpec((rows, chunk), lambda i: (i, 0)),
        ],
        out_specs=pl.BlockSpec((rows, width), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((tokens, width), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        cost_estimate=cost,
        interpret=interpret,
        name="rotary_embedding",
    )(x2, cos_full, sin_signed)
    return out.reshape(tokens, num_heads, head_dim)
