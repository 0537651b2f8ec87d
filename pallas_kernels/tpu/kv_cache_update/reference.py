"""Pure-jnp references of the pool updates: a scatter of each token's row into its slot."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.tpu.kv_pool.layout import interleave_kv
from pallas_kernels.tpu.kv_pool.quantized import QuantizedKVPool, quantize_kv_rows


def _slots(slot_mapping, num_slots: int):  # [T]: out-of-range slots past the end, to be dropped
    return jnp.where((slot_mapping >= 0) & (slot_mapping < num_slots), slot_mapping, num_slots)


def update_kv_cache_reference(
    kv_pages: jax.Array,  # [P, S, C, Dp]
    new_k: jax.Array,  # [T, Hkv, D]
    new_v: jax.Array,  # [T, Hkv, D]
    slot_mapping: jax.Array,  # [T] int32
) -> jax.Array:  # [P, S, C, Dp]
    """Scatter of each token's interleaved K/V row into its slot; out-of-range slots dropped."""
    num_pages, page_size, num_rows, head_dim_padded = kv_pages.shape
    rows = interleave_kv(
        new_k.astype(kv_pages.dtype),
        new_v.astype(kv_pages.dtype),
        num_rows=num_rows,
        head_dim_padded=head_dim_padded,
    )  # [T, C, Dp]
    num_slots = num_pages * page_size
    flat = kv_pages.reshape(num_slots, num_rows, head_dim_padded)
    return flat.at[_slots(slot_mapping, num_slots)].set(rows, mode="drop").reshape(kv_pages.shape)


def update_quantized_pool_reference(
    pool: QuantizedKVPool,
    new_k: jax.Array,  # [T, Hkv, D]
    new_v: jax.Array,  # [T, Hkv, D]
    slot_mapping: jax.Array,  # [T] int32
) -> QuantizedKVPool:
    """Scatter of each token's quantised rows and scales into its slot (out-of-range dropped)."""
    num_pages, page_size, num_rows, head_dim_padded = pool.codes.shape
    codes, scales = quantize_kv_rows(pool, new_k, new_v)
    num_slots = num_pages * page_size
    slots = _slots(slot_mapping, num_slots)
    flat_codes = pool.codes.reshape(num_slots, num_rows, head_dim_padded)
    flat_scales = pool.scales.transpose(1, 0, 2).reshape(-1, num_slots)  # [C * G, P * S]
    flat_scales = flat_scales.at[:, slots].set(scales.T, mode="drop")
    return QuantizedKVPool(
        flat_codes.at[slots].set(codes, mode="drop").reshape(pool.codes.shape),
        flat_scales.reshape(-1, num_pages, page_size).transpose(1, 0, 2),
    )
