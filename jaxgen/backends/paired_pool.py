"""The K/V pool as two arrays per layer, ``[num_kv_heads, num_pages, page_size, head_dim]``
each, written by an XLA scatter: the layout of the reference, Pallas GPU and native CPU
backends."""

from __future__ import annotations

import dataclasses
import functools

import jax
from jax.sharding import NamedSharding, PartitionSpec

from jaxgen.attention import AttentionMetadata
from jaxgen.backends.base import AttentionBackend
from jaxgen.quantization import kv_cache


def write_kv(
    k_pages,  # [Hkv, P, S, D], or QuantizedPages
    v_pages,  # [Hkv, P, S, D], or QuantizedPages
    k: jax.Array,  # [T, Hkv, D]
    v: jax.Array,  # [T, Hkv, D]
    slot_mapping: jax.Array,  # [T]
):
    """Scatters new keys and values into their slots (in place when the pool is donated); an
    8-bit pool quantises them per token and head (``jaxgen.quantization.kv_cache``)."""
    return kv_cache.write(k_pages, k, slot_mapping), kv_cache.write(v_pages, v, slot_mapping)


@dataclasses.dataclass(frozen=True)
class PairedPoolBackend(AttentionBackend):
    """A backend over (k_pages, v_pages) per layer; subclasses provide :meth:`paged_attention`
    over the step's ragged metadata. ``kv_cache_dtype`` "int8" / "fp8": each pool is a
    ``QuantizedPages`` (8-bit values, a scale per token and head)."""

    kv_cache_dtype: str = "auto"

    def kv_pool_shapes(self, config, num_pages: int, page_size: int, dtype) -> list:
        shape = (config.num_kv_heads, num_pages, page_size, config.head_dim)
        pool = kv_cache.pool_shapes(self.kv_cache_dtype, shape, dtype)
        return [(pool, pool) for _ in range(config.num_layers)]

    def kv_pool_sharding(self, kv_sharding: NamedSharding | None):
        return kv_sharding

    def kv_pool_spec(self, model_axis: str | None) -> PartitionSpec:
        return PartitionSpec(model_axis, None, None, None)

    def allocate_kv_pool(self, config, num_pages, page_size, dtype, kv_sharding=None) -> list:
        shape = (config.num_kv_heads, num_pages, page_size, config.head_dim)
        make = functools.partial(kv_cache.zeros, self.kv_cache_dtype, shape, dtype)
        if kv_sharding is not None:
            if self.kv_cache_dtype != "auto":
                raise ValueError(
                    f"kv_cache_dtype={self.kv_cache_dtype!r} is not supported with tensor "
                    "parallelism yet; use kv_cache_dtype='auto'"
                )
            make = jax.jit(make, out_shardings=kv_sharding)
        return [(make(), make()) for _ in range(config.num_layers)]

    def attention(self, q, k, v, kv_layer, md: AttentionMetadata, **opts):
        k_pages, v_pages = write_kv(*kv_layer, k, v, md.slot_mapping)
        return self.paged_attention(q, k_pages, v_pages, md, **opts), (k_pages, v_pages)

    def paged_attention(self, q, k_pages, v_pages, md, **opts):  # [T, Hq, D]
        raise NotImplementedError
