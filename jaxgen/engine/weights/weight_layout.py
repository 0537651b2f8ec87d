"""The layout of an engine's parameters, for weights that change under it: every parameter's
dotted name (``layers.0.self_attn.q_proj.kernel``, the names ``jaxgen.layers.sharding`` and the
orbax checkpoints use), its value's structure (a plain array, or a ``QuantizedWeight``'s fields
and static metadata), and each array's shape, dtype and sharding.

``WeightLayout.place`` checks a whole new set of weights against it before anything is placed or
swapped (a ``ValueError`` naming the first parameter that does not fit), then puts each array
on the engine's devices: an array already there with the engine's sharding is held as it is (no
copy, no host round trip), any other is ``jax.device_put`` there as the engine's own array was
(into its sharding when committed to it, to the default device when not: jit keys executables
on commitment). Equal shapes, dtypes, shardings and commitment keep every compiled step: the
step takes the parameters as arguments.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import numpy as np
from flax import nnx

from jaxgen.layers.sharding import path_name
from jaxgen.quantization.quantized_weight import QuantizedWeight


def named_values(tree) -> dict[str, object]:
    """The values of a parameter tree by dotted name: an ``nnx.State`` (``LLM.params``,
    ``nnx.state(model, nnx.Param)``), an ``nnx.Module``, a nested dict (``State.to_pure_dict()``,
    int or str keys for a layer's index) or a flat dict of dotted names; ``nnx.Variable``s are
    unwrapped, a ``QuantizedWeight`` is one value."""
    if isinstance(tree, nnx.Module):
        tree = nnx.state(tree)
    if not isinstance(tree, Mapping):
        raise ValueError(
            "params must be a parameter tree in the model's naming (an nnx.State, a nested dict "
            f"or a dict of dotted names), got {type(tree).__name__}"
        )
    named: dict[str, object] = {}
    _walk(tree, (), named)
    return named


def _walk(node, path: tuple, named: dict) -> None:
    if isinstance(node, nnx.State):
        for sub, var in nnx.to_flat_state(node):
            named[path_name(path + tuple(sub))] = _unwrap(var)
    elif isinstance(node, Mapping):
        for key, child in node.items():
            _walk(child, path + (key,), named)
    else:
        named[path_name(path)] = _unwrap(node)


def _unwrap(value):
    return value.get_value() if isinstance(value, nnx.Variable) else value


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One parameter: where it sits, what it holds, and whether a trainer holds it."""

    path: tuple
    name: str
    variable: nnx.Variable  # holding the abstract value (for the state rebuilt around new arrays)
    trainable: bool  # an ``nnx.Param``: a new set of weights must give it
    treedef: jax.tree_util.PyTreeDef  # of the value: a QuantizedWeight's fields and metadata
    leaves: tuple[jax.ShapeDtypeStruct, ...]  # shape, dtype and sharding of each array
    # Whether each array is committed to its devices: jit keys its executables on it, so a
    # new array is placed as the old one was (an uncommitted one by a plain device_put).
    committed: tuple[bool, ...]

    def check(self, value) -> list:
        """``value``'s arrays if it fits this parameter, else a ``ValueError`` naming it."""
        leaves, treedef = jax.tree_util.tree_flatten(value)
        if treedef != self.treedef:
            expected = jax.tree_util.tree_unflatten(self.treedef, self.leaves)
            hint = ""
            if isinstance(expected, QuantizedWeight) and not isinstance(value, QuantizedWeight):
                hint = (
                    " (the engine holds it quantised: give it as such, or read a float "
                    "checkpoint with update_weights_from_path, which quantises as at load)"
                )
            raise ValueError(
                f"parameter {self.name!r} is {_describe(value)}; the model's is "
                f"{_describe(expected)}{hint}"
            )
        for leaf, spec in zip(leaves, self.leaves, strict=True):
            shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
            if shape is None or dtype is None:
                raise ValueError(
                    f"parameter {self.name!r} is a {type(leaf).__name__}, not an array"
                )
            if tuple(shape) != tuple(spec.shape):
                raise ValueError(
                    f"parameter {self.name!r} has shape {tuple(shape)}; the model's is "
                    f"{tuple(spec.shape)}"
                )
            if np.dtype(dtype) != np.dtype(spec.dtype):
                raise ValueError(
                    f"parameter {self.name!r} has dtype {np.dtype(dtype)}; the model's is "
                    f"{np.dtype(spec.dtype)} (cast the weights to the engine's dtype first)"
                )
            if isinstance(leaf, jax.Array) and leaf.is_deleted():
                raise ValueError(
                    f"parameter {self.name!r} is a deleted array (donated to a jitted call?)"
                )
        return leaves


def _describe(value) -> str:
    if isinstance(value, QuantizedWeight):
        what = f"{value.kind} QuantizedWeight of shape {tuple(value.shape)}"
    elif hasattr(value, "shape") and hasattr(value, "dtype"):
        what = f"{np.dtype(value.dtype)} array of shape {tuple(value.shape)}"
    else:
        what = type(value).__name__
    return ("an " if what[0] in "aeiou" else "a ") + what


class WeightLayout:
    """An engine's parameters as laid out when it was built (``of``): what new weights must
    match, wherever they come from (a trainer's tree, a checkpoint, the host copy of sleep)."""

    def __init__(self, entries: list[_Entry]):
        self.entries = entries
        self.by_name = {entry.name: entry for entry in entries}

    @classmethod
    def of(cls, params) -> WeightLayout:
        """The layout of ``params`` (an ``nnx.State`` of placed arrays)."""
        entries = []
        default = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])  # a host array's
        for path, var in nnx.to_flat_state(params):
            leaves, treedef = jax.tree_util.tree_flatten(var.get_value())
            specs = tuple(
                jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=_sharding(leaf, default))
                for leaf in leaves
            )
            abstract = var.replace(jax.tree_util.tree_unflatten(treedef, specs))
            trainable = isinstance(var, nnx.Param)
            committed = tuple(bool(getattr(leaf, "committed", True)) for leaf in leaves)
            entries.append(
                _Entry(tuple(path), path_name(path), abstract, trainable, treedef, specs, committed)
            )
        return cls(entries)

    @property
    def buffer_names(self) -> list[str]:
        """The parameters that are no ``nnx.Param`` (RoPE tables): a new set may leave them out."""
        return [entry.name for entry in self.entries if not entry.trainable]

    def abstract_state(self) -> nnx.State:
        """The parameters' shapes (``jax.ShapeDtypeStruct`` with their shardings), as an
        ``nnx.State``: what ``params`` holds while the weights sleep."""
        return nnx.from_flat_state([(entry.path, entry.variable) for entry in self.entries])

    def place(self, tree, kept: Mapping[str, object] | None = None) -> nnx.State:
        """``tree`` (any form ``named_values`` reads) checked against the layout, every
        parameter before any is placed, then placed on the engine's devices as an
        ``nnx.State``. A parameter that is no ``nnx.Param`` may be left out: it takes its value
        from ``kept`` (by name). Raises ``ValueError`` naming the first parameter missing,
        unknown, or of another structure, shape or dtype (nothing is placed then)."""
        given = named_values(tree)
        kept = kept or {}
        checked = []  # per entry: its arrays, and whether they are new
        for entry in self.entries:
            if entry.name in given:
                checked.append((entry.check(given[entry.name]), True))
            elif not entry.trainable and entry.name in kept:
                checked.append((jax.tree_util.tree_leaves(kept[entry.name]), False))
            else:
                raise ValueError(f"params has no parameter {entry.name!r} (the model's)")
        unknown = [name for name in given if name not in self.by_name]
        if unknown:
            raise ValueError(
                f"params has a parameter the model has not: {unknown[0]!r} (the model's names "
                f"are like {self.entries[0].name!r})"
            )
        committed, uncommitted = _Moves(), _Moves()  # arrays to put on the devices
        for (leaves, new), entry in zip(checked, self.entries, strict=True):
            for index, leaf in enumerate(leaves):
                spec, commit = entry.leaves[index], entry.committed[index]
                if new and not _in_place(leaf, spec.sharding, commit):
                    (committed if commit else uncommitted).add(leaves, index, spec.sharding)
        committed.place(lambda arrays, shardings: jax.device_put(arrays, shardings))
        uncommitted.place(lambda arrays, shardings: jax.device_put(arrays))  # default device
        return nnx.from_flat_state(
            [
                (
                    entry.path,
                    entry.variable.replace(jax.tree_util.tree_unflatten(entry.treedef, leaves)),
                )
                for (leaves, _), entry in zip(checked, self.entries, strict=True)
            ]
        )


def _sharding(leaf, default):
    return leaf.sharding if isinstance(leaf, jax.Array) else default


def _in_place(leaf, sharding, committed: bool) -> bool:
    """Whether ``leaf`` is a device array the engine can hold as it is: of its sharding, and
    committed where its own was (an uncommitted engine array takes a committed one as it is,
    at the cost of one more compile of each step shape for that form)."""
    return (
        isinstance(leaf, jax.Array)
        and leaf.sharding.is_equivalent_to(sharding, leaf.ndim)
        and (leaf.committed or not committed)
    )


class _Moves:
    """Arrays to put on the devices in one call, and where each goes back."""

    def __init__(self):
        self.slots, self.arrays, self.shardings = [], [], []

    def add(self, leaves: list, index: int, sharding) -> None:
        self.slots.append((leaves, index))
        self.arrays.append(leaves[index])
        self.shardings.append(sharding)

    def place(self, put) -> None:
        if self.arrays:
            placed = put(self.arrays, self.shardings)
            for (leaves, index), array in zip(self.slots, placed, strict=True):
                leaves[index] = array
