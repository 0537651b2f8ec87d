"""The pallas-tpu backend's quantised ``Linear`` kernels: int8 / int4 codes and scales streamed
from HBM by ``pallas_kernels.tpu.streamed_matmul.quantized`` and dequantised in VMEM.

``StreamedQuantizedWeight`` wraps a ``QuantizedWeight`` as ``StreamedWeight`` wraps a float
kernel: decode-sized products run the Pallas kernel (inside ``jax.shard_map`` with the weight's
own split under tensor parallelism: columns split give split outputs, a depth split sums partial
products), larger ones XLA's dot on the dequantised weight. Float16 scales (and mins) stay 16-bit
in HBM, packed two groups to an int32 word (``pack_float16_pairs``, each chip's own groups
paired) and turned into float32 in VMEM; where a chip's share has an odd number of groups they
are held in float32 instead (exact, 4 bytes a group). Its columns are padded so that each chip's
share tiles in 128 lanes.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from jaxgen.backends.streamed_weight import (
    MAX_STREAMED_ROWS,
    gated_input,
    interpret_params,
    kernel_input,
    norm_keyword,
    norm_leaves,
    pad_columns,
    split_axis,
)
from jaxgen.quantization.quantized_weight import QuantizedWeight
from pallas_kernels.tpu.streamed_matmul import (
    pack_float16_pairs,
    streamed_gated_matmul_quantized_tpu,
    streamed_matmul_quantized_plan,
    streamed_matmul_quantized_tpu,
    unpack_float16_pairs,
)
from pallas_kernels.tpu.tiling import LANES


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["weight"],
    meta_fields=["columns", "split", "mesh", "model_axis", "interpret", "packed_pieces"],
)
@dataclasses.dataclass(frozen=True)
class StreamedQuantizedWeight:
    """``weight``: the quantised [K, N'] kernel (N' >= ``columns`` padded) with float32 or
    bfloat16 scales, or float16 ones packed in pairs (``packed_pieces`` > 0: the number of row
    blocks, one per chip of a depth split, whose groups are paired); ``split``: "depth",
    "columns" or None over ``model_axis`` of ``mesh``."""

    weight: QuantizedWeight
    columns: int
    split: str | None = None
    mesh: Mesh | None = None
    model_axis: str | None = None
    interpret: bool = False
    packed_pieces: int = 0
    norms_input = True  # takes a NormedInput as x (jaxgen.layers.linear)

    @classmethod
    def wrap(cls, weight: QuantizedWeight, *, mesh=None, model_axis=None, interpret=False):
        """``weight`` (arrays, or ``ShapeDtypeStruct``s ahead of time) in the kernel's form."""
        # The kernel reads a scale (and min) per group and int8 / int4 codes (bit planes
        # widened; the backend keeps those on XLA's dot instead, at the file's bytes).
        weight = weight.plain_layout()
        split = split_axis(weight.values, mesh, model_axis, 0)
        degree = mesh.shape[model_axis] if split == "columns" else 1
        pieces = mesh.shape[model_axis] if split == "depth" else 1
        depth, columns = weight.shape
        padded = -(-columns // (LANES * degree)) * LANES * degree
        float_leaves = [weight.scales] + ([] if weight.mins is None else [weight.mins])
        packs = all(leaf.dtype == jnp.float16 for leaf in float_leaves) and not (
            (depth // weight.group_size) % (2 * pieces)
        )

        def prepare(leaf, is_float):
            if is_float and packs:
                leaf = _packed(leaf, pieces)
            elif is_float and leaf.dtype not in (jnp.float32, jnp.bfloat16):
                leaf = _as_float32(leaf)
            return pad_columns(leaf, 1, padded - columns) if padded != columns else leaf

        weight = dataclasses.replace(
            weight,
            values=prepare(weight.values, False),
            scales=prepare(weight.scales, True),
            mins=None if weight.mins is None else prepare(weight.mins, True),
            shape=(depth, padded),
        )
        return cls(weight, columns, split, mesh, model_axis, interpret, pieces if packs else 0)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.weight.shape[0], self.columns)

    @property
    def dtype(self):
        return jnp.dtype(jnp.float16) if self.packed_pieces else self.weight.dtype

    def unpacked(self) -> QuantizedWeight:
        """The weight with float16 scales (and mins) again when they are packed (for XLA)."""
        if not self.packed_pieces:
            return self.weight
        unpack = functools.partial(unpack_float16_pairs, pieces=self.packed_pieces)
        mins = self.weight.mins
        return dataclasses.replace(
            self.weight,
            scales=unpack(self.weight.scales),
            mins=None if mins is None else unpack(mins),
        )

    def matmul(self, x, live_rows: jax.Array | None = None) -> jax.Array:
        """``x @ dequant(w)`` ([..., K] -> [..., N]; x an array or a ``NormedInput``)."""
        depth, columns = self.shape
        rows = math.prod(x.shape[:-1])
        x, norm = kernel_input(x, self, rows, self.streams)
        if not self.streams(rows, x.dtype, normed=norm is not None):
            return self.unpacked().matmul(x)[..., :columns]
        product = functools.partial(streamed_matmul_quantized_tpu, interpret=interpret_params(self))
        x2 = x.reshape(rows, depth)
        if self.mesh is None:
            out = product(x2, self.weight, norm=norm)
        else:
            out = self.sharded(product, x2, norm=norm)
        return out[:, :columns].reshape(*x.shape[:-1], columns)

    @staticmethod
    def matmul_gated(x, gate, up, activation: str, live_rows=None):
        """``act(x @ dequant(gate)) * (x @ dequant(up))`` in one streamed call, or None where
        the kernel does not take it (the caller then runs the two matmuls)."""
        prepared = gated_input(x, gate, up, activation)
        if prepared is None:
            return None
        x2, norm = prepared
        gated = functools.partial(
            streamed_gated_matmul_quantized_tpu,
            activation=activation,
            interpret=interpret_params(gate),
        )
        columns = gate.shape[1]
        if gate.mesh is None:
            out = gated(x2, gate.weight, up.weight, norm=norm)
        else:
            out = gate.sharded(gated, x2, up, norm=norm)
        return out[:, :columns].reshape(*x.shape[:-1], columns)

    def _local_shape(self) -> tuple[int, int]:
        depth, padded = self.weight.shape
        if self.split is None:
            return depth, padded
        degree = self.mesh.shape[self.model_axis]
        return (depth // degree, padded) if self.split == "depth" else (depth, padded // degree)

    def streams(self, rows: int, dtype, num_weights: int = 1, normed: bool = False) -> bool:
        if rows > MAX_STREAMED_ROWS or self.weight.kind not in ("int8", "int4"):
            return False
        if dtype not in (jnp.bfloat16, jnp.float32):
            return False
        depth, columns = self._local_shape()
        plan = streamed_matmul_quantized_plan(
            rows,
            depth,
            columns,
            self.weight.group_size,
            packed_scales=bool(self.packed_pieces),
            num_weights=num_weights,
            normed=normed,
        )
        return plan is not None

    def sharded(self, product, x2, other=None, norm=None):
        """The product inside ``shard_map`` (each chip its share of codes and scales; the norm's
        weight, if any, replicated); ``other``: a second kernel of the same layout whose local
        weight ``product`` takes after this one's (the gated call's up)."""
        axis, split = self.model_axis, self.split
        depth_spec = axis if split == "depth" else None
        column_spec = axis if split == "columns" else None
        leaf_spec = PartitionSpec(depth_spec, column_spec)
        local_shape = self._local_shape()
        kernels = [self] if other is None else [self, other]
        leaves = [leaf for kernel in kernels for leaf in _leaves(kernel.weight)]
        per_weight = len(leaves) // len(kernels)
        norm_weights = norm_leaves(norm)

        num_leaves = len(leaves)

        def local(x, *inputs):
            leaves, norm_weight = inputs[:num_leaves], inputs[num_leaves:]
            weights = [
                dataclasses.replace(
                    kernel.weight,
                    values=leaves[i * per_weight],
                    scales=leaves[i * per_weight + 1],
                    mins=leaves[i * per_weight + 2] if per_weight == 3 else None,
                    shape=local_shape,
                )
                for i, kernel in enumerate(kernels)
            ]
            out = product(x, *weights, **norm_keyword(norm, norm_weight))
            return jax.lax.psum(out, axis) if split == "depth" else out

        return jax.shard_map(
            local,
            mesh=self.mesh,
            in_specs=(PartitionSpec(None, depth_spec), *[leaf_spec] * len(leaves))
            + (PartitionSpec(),) * len(norm_weights),
            out_specs=PartitionSpec(None, column_spec),
            check_vma=False,
        )(x2, *leaves, *norm_weights)


def _leaves(weight) -> list:
    return [weight.values, weight.scales] + ([weight.mins] if weight.mins is not None else [])


def _as_float32(leaf):
    """``leaf`` in float32, same sharding (a ``ShapeDtypeStruct`` ahead of time)."""
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(leaf.shape, jnp.float32, sharding=leaf.sharding)
    sharding = getattr(leaf, "sharding", None)
    convert = functools.partial(jnp.asarray, dtype=jnp.float32)
    return jax.jit(convert, out_shardings=sharding)(leaf) if sharding is not None else convert(leaf)


def _packed(leaf, pieces: int):
    """float16 ``[G, N]`` as ``[G / 2, N]`` int32 packed pairs (``pack_float16_pairs``), same
    sharding (a ``ShapeDtypeStruct`` ahead of time)."""
    groups, columns = leaf.shape
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct((groups // 2, columns), jnp.int32, sharding=leaf.sharding)
    pack = functools.partial(pack_float16_pairs, pieces=pieces)
    sharding = getattr(leaf, "sharding", None)
    return jax.jit(pack, out_shardings=sharding)(leaf) if sharding is not None else pack(leaf)
