"""The step's parameters as a flat list of distinct arrays, with their (static) layout."""

from __future__ import annotations

import dataclasses

import jax


@dataclasses.dataclass(frozen=True)
class FlatParams:
    """How the step's parameters and LM head kernel come as a flat list of distinct arrays:
    ``treedef`` of ``(params, head)``, and for each of its leaves the position of its array in
    the list. An array used by several kernels (a backend's shared buffer) is passed once, so a
    step's dispatch handles each buffer once: on CPU each argument costs microseconds, and a
    model of 700 leaves spent ~2 ms a step on it. A static argument: equal layouts share a
    compiled step, and the hash is computed once."""

    treedef: jax.tree_util.PyTreeDef
    positions: tuple[int, ...]
    _hash: int = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_hash", hash((self.treedef, self.positions)))

    def __hash__(self) -> int:
        return self._hash

    @classmethod
    def flatten(cls, params, head) -> tuple[list, FlatParams]:
        """The distinct arrays of ``(params, head)``, in order of first use, and their layout."""
        leaves, treedef = jax.tree_util.tree_flatten((params, head))
        distinct, index, positions = [], {}, []
        for leaf in leaves:
            if id(leaf) not in index:
                index[id(leaf)] = len(distinct)
                distinct.append(leaf)
            positions.append(index[id(leaf)])
        return distinct, cls(treedef, tuple(positions))

    def unflatten(self, distinct: list) -> tuple:
        """``(params, head)`` from the distinct arrays."""
        return jax.tree_util.tree_unflatten(self.treedef, [distinct[i] for i in self.positions])
