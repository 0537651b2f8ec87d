"""The K/V pool as two arrays per layer, ``[num_kv_heads, num_pages, page_size, head_dim]``
each, written by an XLA scatter: the layout of the reference, Pallas GPU and native CPU
backends."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from jaxgen.attention import AttentionMetadata
from jaxgen.backends.base import AttentionBackend


def write_kv(
    k_pages: jax.Array,  # [Hkv, P, S, D]
    v_pages: jax.Array,  # [Hkv, P, S, D]
    k: jax.Array,  # [T, Hkv, D]
    v: jax.Array,  # [T, Hkv, D]
    slot_mapping: jax.Array,  # [T]
) -> tuple[jax.Array, jax.Array]:
    """Scatters new keys and values into their slots (in place when the pool is donated)."""
    hkv, pages, page_size, dim = k_pages.shape
    k_flat = (
        k_pages.reshape(hkv, pages * page_size, dim)
        .at[:, slot_mapping]
        .set(k.swapaxes(0, 1).astype(k_pages.dtype), unique_indices=False)
    )
    v_flat = (
        v_pages.reshape(hkv, pages * page_size, dim)
        .at[:, slot_mapping]
        .set(v.swapaxes(0, 1).astype(v_pages.dtype), unique_indices=False)
    )
    return k_flat.reshape(k_pages.shape), v_flat.reshape(v_pages.shape)


@dataclasses.dataclass(frozen=True)
class PairedPoolBackend(AttentionBackend):
    """A backend over (k_pages, v_pages) per layer; subclasses provide :meth:`paged_attention`
    over the step's ragged metadata."""

    def kv_pool_shapes(self, config, num_pages: int, page_size: int, dtype) -> list:
        shape = jax.ShapeDtypeStruct(
            (config.num_kv_heads, num_pages, page_size, config.head_dim), dtype
        )
        return [(shape, shape) for _ in range(config.num_layers)]

    def kv_pool_sharding(self, kv_sharding: NamedSharding | None):
        return kv_sharding

    def kv_pool_spec(self, model_axis: str | None) -> PartitionSpec:
        return PartitionSpec(model_axis, None, None, None)

    def allocate_kv_pool(self, config, num_pages, page_size, dtype, kv_sharding=None) -> list:
        shape = (config.num_kv_heads, num_pages, page_size, config.head_dim)
        make = functools.partial(jnp.zeros, shape, dtype)
        if kv_sharding is not None:
            make = jax.jit(make, out_shardings=kv_sharding)
        return [(make(), make()) for _ in range(config.num_layers)]

    def attention(self, q, k, v, kv_layer, md: AttentionMetadata, **opts):
        k_pages, v_pages = write_kv(*kv_layer, k, v, md.slot_mapping)
        return self.paged_attention(q, k_pages, v_pages, md, **opts), (k_pages, v_pages)

    def paged_attention(self, q, k_pages, v_pages, md, **opts):  # [T, Hq, D]
        raise NotImplementedError
