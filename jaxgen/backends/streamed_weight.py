"""The pallas-tpu backend's ``Linear`` kernels: weights streamed from HBM by a Pallas matmul.

``StreamedWeight`` wraps a ``Linear`` kernel (or the embedding used as the LM head) and
provides the kernel protocol of ``jaxgen.layers.linear``. Its :meth:`~StreamedWeight.matmul`
runs ``pallas_kernels.tpu.streamed_matmul`` for decode-sized inputs and XLA's dot for larger
ones (compute-bound prefill) or shapes the kernel cannot tile. Pallas calls are not partitioned
by XLA, so under tensor parallelism the call runs inside ``jax.shard_map`` with the weight's own
split, as XLA would have placed the dot: a column-split weight (q/k/v, gate/up, LM head) gives a
column-split output; a depth-split one (o, down) sums its partial products over the model axis.

Both kernel types take a ``NormedInput`` (``norms_input``): where the call streams whole rows
(not a depth split), the kernel norms x in VMEM; elsewhere the norm is computed in XLA first.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxgen.layers.linear import NormedInput
from pallas_kernels.tpu.streamed_matmul import (
    GATED_ACTIVATIONS,
    streamed_gated_matmul_tpu,
    streamed_matmul_plan,
    streamed_matmul_tpu,
)
from pallas_kernels.tpu.tiling import LANES

# Above this many rows a product is compute-bound and XLA's dot, tiled over rows and columns,
# is the better tool.
MAX_STREAMED_ROWS = 512


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["values"],
    meta_fields=["columns", "transposed", "split", "mesh", "model_axis", "interpret"],
)
@dataclasses.dataclass(frozen=True)
class StreamedWeight:
    """``values``: the weight, [K, N'] or [N', K] when ``transposed``, N' >= ``columns`` (the
    columns padded so that each chip's share tiles in 128 lanes); ``split``: which of "depth"
    (K) or "columns" (N) is split over ``model_axis`` of ``mesh``, or None (replicated over
    the mesh, or on one device when ``mesh`` is None)."""

    values: jax.Array
    columns: int
    transposed: bool = False
    split: str | None = None
    mesh: Mesh | None = None
    model_axis: str | None = None
    interpret: bool = False
    norms_input = True  # takes a NormedInput as x (jaxgen.layers.linear)

    @classmethod
    def wrap(cls, value, *, transposed=False, mesh=None, model_axis=None, interpret=False):
        """``value`` (an array, or a ``ShapeDtypeStruct`` when compiling ahead of time) as a
        ``StreamedWeight``, its split read from its sharding, its columns padded when each
        chip's share would not tile otherwise."""
        depth_axis, column_axis = (1, 0) if transposed else (0, 1)
        split = split_axis(value, mesh, model_axis, depth_axis)
        degree = mesh.shape[model_axis] if split == "columns" else 1
        depth = value.shape[depth_axis] // (mesh.shape[model_axis] if split == "depth" else 1)
        columns, itemsize = value.shape[column_axis], jnp.dtype(value.dtype).itemsize
        if streamed_matmul_plan(1, depth, columns // degree, itemsize) is None:
            padded = -(-columns // (LANES * degree)) * LANES * degree
            value = pad_columns(value, column_axis, padded - columns)
        return cls(value, columns, transposed, split, mesh, model_axis, interpret)

    @property
    def shape(self) -> tuple[int, int]:
        """The [K, N] shape of the weight it stands for."""
        depth = self.values.shape[1 if self.transposed else 0]
        return (depth, self.columns)

    @property
    def dtype(self):
        return self.values.dtype

    def matmul(self, x, live_rows: jax.Array | None = None) -> jax.Array:
        """``x @ w`` ([..., K] -> [..., N]; x an array or a ``NormedInput``); ``live_rows`` is
        not needed (padding rows cost only their share of a decode-sized product)."""
        depth, columns = self.shape
        rows = math.prod(x.shape[:-1])
        x, norm = kernel_input(x, self, rows, self.streams)
        if not self.streams(rows, x.dtype, normed=norm is not None):
            weight = self.values.T if self.transposed else self.values
            return jnp.dot(x, weight)[..., :columns]  # slicing the output keeps w's split
        product = functools.partial(
            streamed_matmul_tpu, transposed=self.transposed, interpret=interpret_params(self)
        )
        x2 = x.reshape(rows, depth)
        if self.mesh is None:
            out = product(x2, self.values, norm=norm)
        else:
            out = self.sharded(product, x2, norm)
        return out[:, :columns].reshape(*x.shape[:-1], columns)

    @staticmethod
    def matmul_gated(x, gate, up, activation: str, live_rows=None):
        """``act(x @ gate) * (x @ up)`` in one streamed call (``[..., K] -> [..., N]``), or None
        where the kernel does not take it (the caller then runs the two matmuls)."""
        prepared = gated_input(x, gate, up, activation)
        if prepared is None:
            return None
        x2, norm = prepared
        product = functools.partial(
            streamed_gated_matmul_tpu, activation=activation, interpret=interpret_params(gate)
        )
        columns = gate.shape[1]
        if gate.mesh is None:
            out = product(x2, gate.values, up.values, norm=norm)
        else:
            spec = PartitionSpec(None, gate.model_axis if gate.split == "columns" else None)
            weights, norm_weights = (gate.values, up.values), norm_leaves(norm)

            def local(x, gate, up, *norm_weight):
                return product(x, gate, up, **norm_keyword(norm, norm_weight))

            out = jax.shard_map(
                local,
                mesh=gate.mesh,
                in_specs=(PartitionSpec(), spec, spec) + (PartitionSpec(),) * len(norm_weights),
                out_specs=spec,
                check_vma=False,
            )(x2, *weights, *norm_weights)
        return out[:, :columns].reshape(*x.shape[:-1], columns)

    def _local_shape(self) -> tuple[int, int]:
        depth, padded = self.values.shape[::-1] if self.transposed else self.values.shape
        if self.split is None:
            return depth, padded
        degree = self.mesh.shape[self.model_axis]
        return (depth // degree, padded) if self.split == "depth" else (depth, padded // degree)

    def streams(self, rows: int, dtype, num_weights: int = 1, normed: bool = False) -> bool:
        if rows > MAX_STREAMED_ROWS or dtype != self.values.dtype:
            return False
        depth, columns = self._local_shape()
        itemsize = jnp.dtype(dtype).itemsize
        plan = streamed_matmul_plan(
            rows, depth, columns, itemsize, num_weights=num_weights, normed=normed
        )
        return plan is not None

    def sharded(self, product, x2, norm=None):
        """The product inside ``shard_map`` over the mesh (each chip its share of w; the norm's
        weight, if any, replicated)."""
        axis, split = self.model_axis, self.split
        # The weight's spec as stored: [K, N], or [N, K] when transposed.
        depth_spec, column_spec = (
            axis if split == "depth" else None,
            axis if split == "columns" else None,
        )
        weight_spec = PartitionSpec(
            *((column_spec, depth_spec) if self.transposed else (depth_spec, column_spec))
        )

        norm_weights = norm_leaves(norm)

        def local(x, w, *norm_weight):  # x [M, K] or [M, K / chips]; w this chip's share
            out = product(x, w, **norm_keyword(norm, norm_weight))
            return jax.lax.psum(out, axis) if split == "depth" else out

        return jax.shard_map(
            local,
            mesh=self.mesh,
            in_specs=(PartitionSpec(None, depth_spec), weight_spec)
            + (PartitionSpec(),) * len(norm_weights),
            out_specs=PartitionSpec(None, column_spec),
            check_vma=False,
        )(x2, self.values, *norm_weights)


def kernel_input(x, kernel, rows: int, streams) -> tuple[jax.Array, tuple | None]:
    """``(x, norm)`` for a streamed call of ``kernel``: a ``NormedInput``'s un-normed rows and
    ``(weight, eps)`` when the call streams (``streams(rows, dtype, normed=True)``) whole rows
    (no depth split) and the norm's weight matches them; otherwise x as an array (a
    ``NormedInput`` computed) and no norm."""
    if not isinstance(x, NormedInput):
        return x, None
    matches = x.weight.shape == x.shape[-1:] and x.weight.dtype == x.dtype
    if matches and kernel.split != "depth" and streams(rows, x.dtype, normed=True):
        return x.x, (x.weight, float(x.eps))
    return x.value(), None


def norm_leaves(norm) -> tuple:
    """The arrays of a ``norm`` argument that enter ``shard_map`` (replicated): its weight."""
    return () if norm is None else (norm[0],)


def norm_keyword(norm, norm_weight: tuple) -> dict:
    """The ``norm=`` argument of a product inside ``shard_map``, rebuilt from its weight's local
    value; none without a norm."""
    return {} if norm is None else {"norm": (norm_weight[0], norm[1])}


def interpret_params(kernel):
    """What a streamed kernel passes Pallas as ``interpret``: False, or the TPU interpreter's
    parameters for a kernel made for tests on CPU."""
    if not kernel.interpret:
        return False
    from jax.experimental.pallas import tpu as pltpu  # only for tests on CPU

    return pltpu.InterpretParams()


def gated_input(x, gate, up, activation: str) -> tuple[jax.Array, tuple | None] | None:
    """``(x2 [M, K], norm)`` for one gated streamed call of ``gate`` and ``up`` (x an array or a
    ``NormedInput``), or None where the kernel does not take them (:func:`gated_streams`, a
    transposed kernel, or no plan that fits)."""
    rows = math.prod(x.shape[:-1])
    if not gated_streams(gate, up, activation) or getattr(gate, "transposed", False):
        return None
    streams = functools.partial(gate.streams, num_weights=2)
    x, norm = kernel_input(x, gate, rows, streams)
    if not streams(rows, x.dtype, normed=norm is not None):
        return None
    return x.reshape(rows, gate.shape[0]), norm


def gated_streams(gate, up, activation: str) -> bool:
    """Whether a gate and an up kernel can share one gated call: the same type, layout and split
    (never over depth: the activation needs the whole sums), and an activation the kernel has."""

    def layout(kernel):
        leaves = jax.tree_util.tree_leaves(kernel)
        shapes = [(leaf.shape, leaf.dtype) for leaf in leaves]
        return type(kernel), jax.tree_util.tree_structure(kernel), shapes

    return activation in GATED_ACTIVATIONS and layout(gate) == layout(up) and gate.split != "depth"


def split_axis(value, mesh, model_axis, depth_axis) -> str | None:
    """ "depth", "columns" or None: which axis of ``value`` its sharding splits over
    ``model_axis``."""
    sharding = getattr(value, "sharding", None)
    if mesh is None or not isinstance(sharding, NamedSharding):
        return None
    spec = tuple(sharding.spec) + (None,) * (value.ndim - len(sharding.spec))
    if model_axis not in spec:
        return None
    return "depth" if spec.index(model_axis) == depth_axis else "columns"


def pad_columns(value, axis: int, amount: int):
    """``value`` with ``amount`` zero columns appended on ``axis`` (same sharding)."""
    shape = tuple(n + amount if dim == axis else n for dim, n in enumerate(value.shape))
    sharding = getattr(value, "sharding", None)
    if isinstance(value, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(shape, value.dtype, sharding=sharding)
    widths = [(0, amount if dim == axis else 0) for dim in range(value.ndim)]
    pad = functools.partial(jnp.pad, pad_width=widths)
    return jax.jit(pad, out_shardings=sharding)(value) if sharding is not None else pad(value)
