"""The device slots of multi-LoRA: for every target projection, ``max_loras`` adapters side by
side (``a`` [in, L x R], ``b`` [L x R, out], ``jaxgen.layers.lora``), arguments of the jitted step.

Loading an adapter into a slot is one jitted, donated ``dynamic_update_slice`` per array (the
slot index is traced): one executable, compiled when the slots are made, serves every load, so
no adapter ever compiles anything. A rank below the slots' is zero-padded, and the projections
an adapter leaves out are zeros in its slot.

Under tensor parallelism (:func:`adapter_shardings`) A is split as its base kernel's input axis
and B as its output axis: a column-parallel projection (q/k/v, gate/up) keeps A whole on every
device and splits B's columns, a row-parallel one (o, down) splits A's rows and keeps B whole,
so each device's shrink and expand read only the activations its base matmul reads.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxgen.layers.lora import with_adapters


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LoRAStacks:
    """Every slot's adapters, by target path: the step's ``lora`` argument."""

    arrays: dict[str, tuple[jax.Array, jax.Array]]  # path -> (a [in, L*R], b [L*R, out])
    rank: int = dataclasses.field(metadata=dict(static=True))  # R

    def apply(self, params, rows: jax.Array):
        """``params`` whose target kernels add each row's adapter (``rows`` [T]: its slot)."""
        return with_adapters(params, self.arrays, rows, self.rank)


class LoRASlots:
    """Owns the slots' device arrays and writes adapters into them."""

    def __init__(
        self,
        targets: dict[str, tuple[int, int]],
        *,
        max_loras: int,
        max_rank: int,
        dtype,
        shardings: dict | None = None,
    ):
        """``targets``: path -> (in, out) of the projections; ``shardings``: path -> (a's, b's)
        ``jax.sharding.Sharding`` under tensor parallelism, or None."""
        self.targets = dict(targets)
        self.max_loras, self.rank, self.dtype = max_loras, max_rank, jnp.dtype(dtype)
        width = max_loras * max_rank
        arrays = {}
        for path, (n_in, n_out) in self.targets.items():
            pair = (np.zeros((n_in, width), self.dtype), np.zeros((width, n_out), self.dtype))
            if shardings is None:
                arrays[path] = tuple(jax.device_put(x) for x in pair)
            else:
                arrays[path] = tuple(map(jax.device_put, pair, shardings[path]))
        self.stacks = LoRAStacks(arrays, max_rank)
        # The written stacks keep the slots' shardings, so the step never sees a new layout.
        placed = jax.tree_util.tree_map(lambda leaf: leaf.sharding, self.stacks)
        self._write = jax.jit(_write_slot, donate_argnums=0, out_shardings=placed)
        self.write(0, None)  # compiles the write now: no load compiles later

    @property
    def nbytes(self) -> int:
        return sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(self.stacks))

    def write(self, slot: int, adapter) -> None:
        """Puts ``adapter`` (a ``PeftAdapter``, or None: zeros) into slot ``slot``."""
        if not 0 <= slot < self.max_loras:
            raise ValueError(f"slot must be in [0, {self.max_loras}), got {slot}")
        new = {}
        for path, (n_in, n_out) in self.targets.items():
            a = np.zeros((n_in, self.rank), self.dtype)
            b = np.zeros((self.rank, n_out), self.dtype)
            if adapter is not None and path in adapter.weights:
                lora_a, lora_b = adapter.weights[path]
                a[:, : lora_a.shape[1]] = lora_a
                b[: lora_b.shape[0]] = lora_b
            new[path] = (a, b)
        self.stacks = self._write(self.stacks, np.int32(slot * self.rank), new)


def _write_slot(stacks: LoRAStacks, start, new: dict) -> LoRAStacks:
    """``stacks`` with columns / rows ``start:start + R`` of every pair replaced by ``new``'s."""
    arrays = {}
    for path, (a, b) in stacks.arrays.items():
        new_a, new_b = new[path]
        zero = jnp.zeros((), jnp.int32)
        arrays[path] = (
            jax.lax.dynamic_update_slice(a, new_a.astype(a.dtype), (zero, start)),
            jax.lax.dynamic_update_slice(b, new_b.astype(b.dtype), (start, zero)),
        )
    return LoRAStacks(arrays, stacks.rank)


def adapter_shardings(params, targets) -> dict | None:
    """path -> (A's, B's) ``NamedSharding`` for the ``targets`` of ``params`` (the loaded decoder
    stack's ``nnx.State``), from each base kernel's own split (module docstring); None when no
    kernel is split over a mesh (one device)."""
    kernels = {}
    is_variable = lambda node: isinstance(node, nnx.Variable)  # noqa: E731
    for path, leaf in jax.tree_util.tree_leaves_with_path(params, is_leaf=is_variable):
        name = ".".join(str(getattr(key, "key", getattr(key, "name", key))) for key in path)
        kernels[name.removesuffix(".kernel")] = leaf.get_value() if is_variable(leaf) else leaf
    shardings, split = {}, False
    for path in targets:
        kernel = kernels[path]
        placed = getattr(getattr(kernel, "values", kernel), "sharding", None)
        if not isinstance(placed, NamedSharding):
            return None
        spec = tuple(placed.spec) + (None,) * (2 - len(placed.spec))
        split = split or any(axis is not None for axis in spec)
        shardings[path] = (
            NamedSharding(placed.mesh, PartitionSpec(spec[0], None)),
            NamedSharding(placed.mesh, PartitionSpec(None, spec[1])),
        )
    return shardings if split else None
