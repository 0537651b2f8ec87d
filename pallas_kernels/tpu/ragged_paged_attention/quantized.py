"""The 8-bit pool's part of the ragged paged-attention kernel (``QuantizedKVPool``: int8 / fp8
codes and lane-major bfloat16 scales); ``kernel`` holds the body and ``pallas_call`` it plugs into.

The codes are never dequantised. Each page's codes and its ``[C * G, S]`` scales are DMA'd into
VMEM (the scales into lanes ``i * S .. (i + 1) * S`` of a ``[C * G, block_k]`` slab, so each
row's scales of a KV block are one lane-dense ``[1, block_k]`` row), and the scales are applied
where they are per key:

  scores[r, t] = sum_g (q[r, group g lanes] . k_codes[t, group g lanes]) * k_scale[g, t]
  out[r, d]    = sum_t (p[r, t] * v_scale[g(d), t]) * v_codes[t, d]

i.e. G masked dots per head for K (lanes of other groups zeroed in q) and G dots for V (the
scaled probabilities, keeping the output lanes of group g). G is 4 at D = 128; one dot each when
G = 1. Codes are exact in q's dtype (int8 and e4m3 both fit bfloat16).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.tpu.kv_pool.quantized import (
    SCALE_TILE_ROWS,
    scale_bytes_per_page,
    scale_groups,
    scale_rows,
    scale_vmem_bytes_per_page,
)


@dataclasses.dataclass(frozen=True)
class EightBitPool:
    """The 8-bit pool's part of the kernel: codes ``[P, S, C, Dp]`` and scales ``[P, C * G, S]``
    in HBM, the scales applied to score columns and probabilities. ``head_dim``: the real one,
    which the scale groups split."""

    head_dim: int
    name: ClassVar[str] = "ragged_paged_attention_quantized"
    num_arrays: ClassVar[int] = 2
    pinned_to_hbm: ClassVar[bool] = True  # else XLA may stage a small pool through VMEM

    def scratch_shapes(self, codes, pages_per_block: int) -> list:
        """Double-buffered codes ``[2, n, S, C, Dp]`` and scales ``[2, C * G, n * S]`` (lane-major)
        slabs, each with its DMA semaphores."""
        _, page_size, num_rows, head_dim_padded = codes.shape
        scales_shape = (2, scale_rows(num_rows, self.head_dim), pages_per_block * page_size)
        return [
            pltpu.VMEM((2, pages_per_block, page_size, num_rows, head_dim_padded), codes.dtype),
            pltpu.SemaphoreType.DMA((2,)),
            pltpu.VMEM(scales_shape, jnp.bfloat16),
            pltpu.SemaphoreType.DMA((2,)),
        ]

    def slab_bytes(self, codes, pages_per_block: int) -> int:
        """VMEM of one slot of the codes and scales slabs."""
        _, page_size, num_rows, head_dim_padded = codes.shape
        code_bytes = pages_per_block * page_size * num_rows * head_dim_padded * codes.dtype.itemsize
        scale_bytes = scale_vmem_bytes_per_page(num_rows, self.head_dim, page_size)
        return code_bytes + pages_per_block * scale_bytes

    def score_temporaries(self) -> int:
        """Per scale group a partial score and scaled probabilities ``[rows, block_k]``."""
        return 2 * scale_groups(self.head_dim)

    def cost_terms(self, codes) -> dict:
        _, page_size, num_rows, _ = codes.shape
        return {
            "kv_itemsize": codes.dtype.itemsize,
            "scale_bytes_per_page": scale_bytes_per_page(num_rows, self.head_dim, page_size),
            "dot_passes": scale_groups(self.head_dim),
        }

    def page_copies(self, hbm_refs, scratch, page_id, slot, i) -> list:
        (codes_hbm_ref, scales_hbm_ref), (codes_buf, code_sems, scale_buf, scale_sems) = (
            hbm_refs,
            scratch,
        )
        page_size = codes_buf.shape[2]
        codes = pltpu.make_async_copy(
            codes_hbm_ref.at[page_id], codes_buf.at[slot, i], code_sems.at[slot]
        )
        scales = pltpu.make_async_copy(
            scales_hbm_ref.at[page_id],
            scale_buf.at[slot, :, pl.ds(i * page_size, page_size)],
            scale_sems.at[slot],
        )
        return [codes, scales]

    def head_step(self, scratch, slot, live_keys, *, rows: int, block_k: int):
        """``step(head, q)`` -> (scores [rows, block_k] float32, weighted_values) of one KV head
        over the slabs in ``slot``; ``q`` [rows, Dp]."""
        codes_buf, _, scale_buf, _ = scratch
        head_dim_padded = codes_buf.shape[-1]
        groups = scale_groups(self.head_dim)
        num_scale_rows = scale_buf.shape[1]
        # Full [rows, Dp] so the mask needs no sublane broadcast (Mosaic has none for booleans).
        lane_group = lax.broadcasted_iota(jnp.int32, (rows, head_dim_padded), 1) // (
            self.head_dim // groups
        )
        # Keys past live_keys may be unfetched (stale VMEM): zero their V codes and scales so
        # 0 * garbage cannot be NaN.
        key_row = lax.broadcasted_iota(jnp.int32, (1, block_k), 1) < live_keys  # [1, block_k]
        key_col = lax.broadcasted_iota(jnp.int32, (block_k, 1), 0) < live_keys  # [block_k, 1]

        def scales_of(row, g):  # [1, block_k]: row ``row``'s group-g scale of every key
            # Picked out of its aligned 16-row bfloat16 tile by a masked sum in float32: Mosaic
            # cannot broadcast a row loaded at a sublane offset.
            index = row * groups + g
            base = index // SCALE_TILE_ROWS * SCALE_TILE_ROWS
            tile = scale_buf[slot, base : min(base + SCALE_TILE_ROWS, num_scale_rows), :]
            tile = tile.astype(jnp.float32)  # [<= 16, block_k]
            pick = lax.broadcasted_iota(jnp.int32, tile.shape, 0) == index - base
            return jnp.sum(jnp.where(pick, tile, 0.0), axis=0, keepdims=True)

        def in_group(x, g):  # lanes of group g kept, others zero (selected in float32: Mosaic
            # has no bfloat16-layout booleans)
            if groups == 1:
                return x
            return jnp.where(lane_group == g, x.astype(jnp.float32), 0.0).astype(x.dtype)

        def step(head, q):
            k = codes_buf[slot, :, :, 2 * head, :].reshape(block_k, head_dim_padded)
            k = k.astype(jnp.float32).astype(q.dtype)
            v = codes_buf[slot, :, :, 2 * head + 1, :].reshape(block_k, head_dim_padded)
            v = jnp.where(key_col, v.astype(jnp.float32), 0.0).astype(q.dtype)
            scores = None
            for g in range(groups):
                partial = lax.dot_general(
                    in_group(q, g), k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
                )  # [rows, block_k]
                partial = partial * scales_of(2 * head, g)
                scores = partial if scores is None else scores + partial

            def weighted_values(probs):
                out = None
                for g in range(groups):
                    v_scales = jnp.where(key_row, scales_of(2 * head + 1, g), 0.0)
                    part = jnp.dot(
                        (probs * v_scales).astype(v.dtype), v, preferred_element_type=jnp.float32
                    )  # [rows, Dp]
                    part = in_group(part, g)
                    out = part if out is None else out + part
                return out

            return scores, weighted_values

        return step
