"""What every attention backend provides: the KV pool's layout and allocation, parameter
preparation, and the attention of one layer over the pool."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import numpy as np
from flax import nnx

from jaxgen.layers.rope import apply_rope


@dataclasses.dataclass(frozen=True)
class KernelBackend:
    """One backend, chosen once per engine; hashable, so it is a static argument of the jitted
    step. Subclasses set ``name`` and implement the pool and :meth:`attention`."""

    name: ClassVar[str] = ""
    # Whether the step's block tables are full width (the kernels read only each sequence's
    # own pages), or as wide as the step's longest sequence (they gather the whole width); see
    # jaxgen/engine/step/step_layout.py.
    full_width_tables: ClassVar[bool] = False
    # Whether the engine marks decode-only steps (``AttentionMetadata.decode_only``): a static
    # flag, so decode-only and mixed steps of one shape compile apart; for backends with a
    # cheaper decode-only attention (Pallas GPU: no prefill kernel).
    marks_decode_only_steps: ClassVar[bool] = False

    @property
    def compiler_options(self) -> dict | None:
        """XLA options the jitted step is compiled with (None: the defaults)."""
        return None

    def prepare_params(self, params, config):
        """The parameters the step runs on, and an LM head to pass the step (or None)."""
        return params, None

    def kv_pool_shapes(self, config, num_pages: int, page_size: int, dtype) -> list:
        """The pool as a list (per layer) of pytrees of ``jax.ShapeDtypeStruct``."""
        raise NotImplementedError

    def allocate_kv_pool(self, config, num_pages, page_size, dtype, kv_sharding=None) -> list:
        """Zeroed pool arrays on the devices ``kv_sharding`` (for the paired layout) names."""
        raise NotImplementedError

    def kv_pool_sharding(self, kv_sharding=None):
        """The pool's shardings under tensor parallelism (None: one device)."""
        return None

    def kv_pool_shares(self, config, page_size: int, dtype, kv_sharding=None) -> int:
        """How many ways every page splits over the devices: 1 on one device or with the KV
        heads replicated, the degree when each device holds its share of the heads."""
        shardings = self.kv_pool_sharding(kv_sharding)
        if shardings is None:
            return 1
        leaf = jax.tree_util.tree_leaves(self.kv_pool_shapes(config, 1, page_size, dtype))[0]
        shard = jax.tree_util.tree_leaves(shardings)[0].shard_shape(leaf.shape)
        return math.prod(leaf.shape) // math.prod(shard)

    def kv_bytes_per_page(self, config, page_size: int, dtype) -> int:
        """Bytes one page takes in every layer together, padding included."""
        layers = self.kv_pool_shapes(config, 1, page_size, dtype)
        return sum(
            math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize
            for leaf in jax.tree_util.tree_leaves(layers)
        )

    def rotate(self, x, rope):
        """RoPE on a step's queries or keys (``x`` [T, H, D]; ``rope``: the step's cos, sin)."""
        return apply_rope(x, rope)

    def attention(self, q, k, v, kv_layer, md, *, scale, soft_cap=None, sliding_window=None):
        """The attention entry point every model calls: writes the step's ``k``/``v``
        ([T, Hkv, D], RoPE applied) into ``kv_layer`` (this layer's slice of the pool, in the
        backend's layout) at ``md.slot_mapping``, then attends every token of ``q``
        ([T, Hq, D]) to its sequence's cache. Returns (``[T, Hq, D]`` output, the updated
        ``kv_layer``)."""
        raise NotImplementedError


def replace_linear_kernels(params: nnx.State, replace) -> nnx.State:
    """A copy of ``params`` with each ``Linear`` kernel ``k`` replaced by ``replace(k)`` where
    that is not None (other leaves shared): how a backend puts kernels in its own form."""
    leaves = []
    for path, var in nnx.to_flat_state(params):
        if path[-1] == "kernel" and (new := replace(var.get_value())) is not None:
            var = var.replace(new)
        leaves.append((path, var))
    return nnx.from_flat_state(leaves)
