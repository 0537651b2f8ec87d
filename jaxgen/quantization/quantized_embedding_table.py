"""``QuantizedEmbeddingTable``: a quantised embedding held row-major, so a lookup reads only the
looked-up rows.

A quantised embedding loads as its LM-head kernel, a ``QuantizedWeight`` ``[hidden, vocab]``
with scales grouped along hidden (one form for the lookup and a tied head), and its lookup
gathers columns. On TPU XLA counts such a column gather of a row-major table as much more than
the rows it returns (about 0.6 GB a step for Llama-3-8B at v5e-4). A backend therefore holds an
*untied* quantised embedding (no head matmul reads it) transposed, ``[vocab, hidden]`` with
scales ``[vocab, hidden / group_size]``: the same values, scales and mins, each token's row
contiguous, and the lookup a row gather.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from jaxgen.quantization.quantized_weight import QuantizedWeight


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["values", "scales", "mins"],
    meta_fields=["kind", "group_size", "shape"],
)
@dataclasses.dataclass(frozen=True)
class QuantizedEmbeddingTable:
    """A quantised ``[vocab, hidden]`` table: ``QuantizedWeight``'s layout transposed
    (``values`` ``[V, D]``, or ``[V, D / 2]`` uint8 for int4 with hidden ``2i`` in byte ``i``'s
    low nibble; ``scales`` and ``mins`` ``[V, D / group_size]``)."""

    values: jax.Array
    scales: jax.Array
    mins: jax.Array | None
    kind: str
    group_size: int
    shape: tuple[int, int]  # (vocab, hidden)

    @classmethod
    def from_kernel(cls, kernel: QuantizedWeight) -> QuantizedEmbeddingTable:
        """The table a ``[hidden, vocab]`` kernel stands for (arrays, or sharded
        ``ShapeDtypeStruct``s ahead of time; a split over vocab stays a split over vocab)."""
        hidden, vocab = kernel.shape
        # A scale (and minimum) per group, codes as numbers (bit planes widened to int8 / int4).
        kernel = kernel.plain_layout()
        return cls(
            values=_transposed(kernel.values),
            scales=_transposed(kernel.scales),
            mins=None if kernel.mins is None else _transposed(kernel.mins),
            kind=kernel.kind,
            group_size=kernel.group_size,
            shape=(vocab, hidden),
        )

    def take_columns(self, ids: jax.Array, dtype=jnp.float32) -> jax.Array:  # [T] -> [T, D]
        """The embedding lookup (the name is the kernel protocol's, see
        ``jaxgen.layers.linear.Embedding``): rows ``ids`` dequantised, i.e. columns ``ids`` of
        the ``[hidden, vocab]`` kernel this table was transposed from."""
        hidden = self.shape[1]
        groups = hidden // self.group_size
        values = jnp.take(self.values, ids, axis=0)  # [T, D] or [T, D / 2]
        if self.kind == "int4":
            low = (values & 0x0F).astype(jnp.float32)
            high = (values >> 4).astype(jnp.float32)
            codes = jnp.stack([low, high], axis=-1).reshape(ids.shape[0], hidden)
            if self.mins is None:
                codes = codes - 8.0
        else:
            codes = values.astype(jnp.float32)
        codes = codes.reshape(ids.shape[0], groups, self.group_size)
        rows = codes * jnp.take(self.scales, ids, axis=0).astype(jnp.float32)[:, :, None]
        if self.mins is not None:
            rows = rows + jnp.take(self.mins, ids, axis=0).astype(jnp.float32)[:, :, None]
        return rows.reshape(ids.shape[0], hidden).astype(dtype)


def _transposed(leaf):
    """``leaf.T`` with its sharding's axes swapped (a ``ShapeDtypeStruct`` ahead of time)."""
    sharding = getattr(leaf, "sharding", None)
    if isinstance(sharding, NamedSharding):
        spec = tuple(sharding.spec) + (None,) * (2 - len(sharding.spec))
        sharding = NamedSharding(sharding.mesh, PartitionSpec(*spec[::-1]))
    else:
        sharding = None
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(leaf.shape[::-1], leaf.dtype, sharding=sharding)
    if sharding is None:
        return jnp.transpose(leaf)
    return jax.jit(jnp.transpose, out_shardings=sharding)(leaf)
