"""The K/V pool as two arrays per layer, ``[num_kv_heads, num_pages, page_size, head_dim]``
each, written by an XLA scatter: the layout of the reference, Pallas GPU and native CPU
backends."""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxgen.backends.base import KernelBackend, replace_linear_kernels
from jaxgen.backends.batch_invariant import chunk_kernel, unchunked_kernels
from jaxgen.layers.attention import AttentionMetadata
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
class PairedPoolBackend(KernelBackend):
    """A backend over (k_pages, v_pages) per layer; subclasses provide :meth:`paged_attention`
    over the step's ragged metadata. ``kv_cache_dtype`` "int8" / "fp8": each pool is a
    ``QuantizedPages`` (8-bit values, a scale per token, head and 32 head_dim elements).

    Tensor parallelism: the pool (codes and scales alike) is split over its KV-head axis
    ``model_axis`` of ``mesh`` (None: KV heads replicated). Backends whose kernels XLA cannot
    partition (custom calls: ``shard_kernels``) run the write and the attention per shard inside
    ``jax.shard_map``; the others leave the split to XLA's partitioner."""

    kv_cache_dtype: str = "auto"
    mesh: Mesh | None = None
    model_axis: str | None = None
    batch_invariant: bool = False  # EngineConfig.batch_invariant (backends/batch_invariant.py)
    shard_kernels: ClassVar[bool] = False

    def invariant_params(self, params, config):
        """``prepare_params`` under ``batch_invariant``: every plain ``Linear`` kernel, and a tied
        embedding as the LM head, in fixed row chunks (``RowChunkedWeight``)."""
        step_params = replace_linear_kernels(params, chunk_kernel)
        if names := unchunked_kernels(params):
            raise ValueError(
                f"batch_invariant: takes plain float kernels, got {', '.join(names)} (quantised "
                "weights); load with quantization='none'"
            )
        if not config.tie_word_embeddings:
            return step_params, None
        table = params["embed_tokens"]["embedding"].get_value()
        return step_params, chunk_kernel(table.T)

    def kv_pool_shapes(self, config, num_pages: int, page_size: int, dtype) -> list:
        shape = (config.num_kv_heads, num_pages, page_size, config.head_dim)
        pool = kv_cache.pool_shapes(self.kv_cache_dtype, shape, dtype)
        return [(pool, pool) for _ in range(config.num_layers)]

    def kv_pool_spec(self, model_axis: str | None = None):
        """One K or V pool's partition spec, split over KV heads: a ``PartitionSpec``, or for an
        8-bit pool a ``QuantizedPages`` of them (codes [Hkv, P, S, D] and scales [Hkv, P, S, G]
        both on axis 0)."""
        spec = PartitionSpec(model_axis or self.model_axis, None, None, None)
        if self.kv_cache_dtype == "auto":
            return spec
        return kv_cache.QuantizedPages(spec, spec)

    def kv_pool_sharding(self, kv_sharding: NamedSharding | None = None):
        """One K or V pool's shardings (the pytree of :meth:`kv_pool_spec`) on ``kv_sharding``'s
        mesh and head axis (default: the backend's own), or None on one device."""
        if kv_sharding is not None:
            mesh, axis = kv_sharding.mesh, kv_sharding.spec[0] if kv_sharding.spec else None
        elif self.mesh is not None:
            mesh, axis = self.mesh, self.model_axis
        else:
            return None
        return jax.tree_util.tree_map(
            lambda spec: NamedSharding(mesh, spec),
            self.kv_pool_spec(axis),
            is_leaf=lambda x: isinstance(x, PartitionSpec),
        )

    def allocate_kv_pool(self, config, num_pages, page_size, dtype, kv_sharding=None) -> list:
        shape = (config.num_kv_heads, num_pages, page_size, config.head_dim)
        make = functools.partial(kv_cache.zeros, self.kv_cache_dtype, shape, dtype)
        sharding = self.kv_pool_sharding(kv_sharding)
        if sharding is not None:
            make = jax.jit(make, out_shardings=sharding)
        return [(make(), make()) for _ in range(config.num_layers)]

    @property
    def degree(self) -> int:
        """Devices the step runs on (1 without a mesh)."""
        return 1 if self.mesh is None else self.mesh.size

    def attention(self, q, k, v, kv_layer, md: AttentionMetadata, **opts):
        def local(q, k, v, kv_layer, md):
            k_pages, v_pages = self.write_kv(*kv_layer, k, v, md.slot_mapping)
            return self.paged_attention(q, k_pages, v_pages, md, **opts), (k_pages, v_pages)

        if not self.shard_kernels or self.degree == 1:
            return local(q, k, v, kv_layer, md)
        # Each device: its KV heads' pool and their query heads. With the KV heads replicated,
        # every device attends with every head (q gathered), as the pool is whole everywhere.
        heads = PartitionSpec(None, self.model_axis, None)  # [T, H, D]
        pool = self.kv_pool_spec()
        return jax.shard_map(
            local,
            mesh=self.mesh,
            in_specs=(heads, heads, heads, (pool, pool), PartitionSpec()),
            out_specs=(heads, (pool, pool)),
            check_vma=False,
        )(q, k, v, kv_layer, md)

    def write_kv(self, k_pages, v_pages, k, v, slot_mapping):
        """The step's new K/V into the layer's pools (XLA's scatter, :func:`write_kv`)."""
        return write_kv(k_pages, v_pages, k, v, slot_mapping)

    def paged_attention(self, q, k_pages, v_pages, md, **opts):  # [T, Hq, D]
        raise NotImplementedError
