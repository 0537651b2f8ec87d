"""LoRA on the projections, as a pass from outside the model (multi-LoRA, Punica / S-LoRA style).

A step that serves adapters wraps each targeted ``Linear`` kernel of its parameters in a
:class:`LoRAKernel` (:func:`with_adapters`) before the model is merged, so the model keeps
calling ``jaxgen.layers.linear`` and knows nothing of adapters. The kernel holds the base kernel
in whatever form the backend gave it, plus every device slot's adapter for that projection side
by side:

- ``a`` [in, L x R]: slot ``s``'s A (``lora_A.T``) in columns ``s*R:(s+1)*R``;
- ``b`` [L x R, out]: slot ``s``'s B (``lora_B.T`` times the adapter's scaling) in those rows;
- ``rows`` [T] int32: each token row's slot, -1 for none (padding rows, requests without one).

``x @ kernel`` is then ``base(x) + ((x @ a) * mask) @ b`` where ``mask`` keeps each row's own
slot's R columns: a shrink and an expand as two dense matmuls over all slots, with no gather (on
CPU a per-row gather of B costs more than the L x R extra columns of a small ``max_loras``). A
rank below R is zero-padded, and a row without an adapter gets exactly ``base(x)``. The slot
arrays are step arguments, so loading, unloading or mixing adapters changes values, never
shapes: no recompile.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxgen.layers.linear import NormedInput, matmuls

# The projections an adapter may target, by their PEFT module name, and where they sit in a
# decoder layer's parameters (every family uses the Llama names).
TARGET_MODULES = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LoRAKernel:
    """A ``Linear`` kernel plus the step's adapters (module docstring)."""

    base: object  # the kernel in the backend's form ([in, out] array, packed, quantised)
    a: jax.Array  # [in, L*R]
    b: jax.Array  # [L*R, out], scaled
    rows: jax.Array  # [T] int32: each row's slot, -1: none
    rank: int = dataclasses.field(metadata=dict(static=True))  # R, the slots' rank

    def delta(self, x: jax.Array) -> jax.Array:  # [T, in] -> [T, out]
        """Each row's ``x @ A[slot] @ B[slot]`` (zero for a row without an adapter)."""
        shrunk = jnp.dot(x.astype(self.a.dtype), self.a)  # [T, L*R]
        column_slot = jnp.arange(self.a.shape[1], dtype=jnp.int32) // self.rank  # [L*R]
        mask = self.rows[: x.shape[0], None] == column_slot[None, :]  # [T, L*R]
        shrunk = jnp.where(mask, shrunk, jnp.zeros((), shrunk.dtype))
        return jnp.dot(shrunk, self.b).astype(x.dtype)

    def matmul(self, x, live_rows=None) -> jax.Array:
        return self.matmul_group(x, [self], live_rows)[0]

    @staticmethod
    def matmul_group(x, kernels: list, live_rows=None) -> list[jax.Array]:
        """The base kernels' products (grouped as the backend groups them), plus each
        adapter's delta."""
        outputs = matmuls(x, [kernel.base for kernel in kernels], live_rows)
        x = x.value() if isinstance(x, NormedInput) else x
        return [y + kernel.delta(x) for kernel, y in zip(kernels, outputs, strict=True)]


def target_path(layer: int, module: str) -> str:
    """The parameter path (dotted, without ``.kernel``) of ``module`` in decoder layer ``layer``."""
    return f"layers.{layer}.{TARGET_MODULES[module]}.{module}"


def lora_targets(params) -> dict[str, tuple[int, int]]:
    """The dense projections of ``params`` (an ``nnx.State`` of the decoder stack) an adapter may
    target: path -> (in, out). A mixture-of-experts layer's experts are not among them."""
    targets = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(params, is_leaf=_is_variable):
        name = _dotted(path)
        parts = name.split(".")
        if (
            len(parts) == 5
            and parts[0] == "layers"
            and parts[3] in TARGET_MODULES
            and parts[2] == TARGET_MODULES[parts[3]]
            and parts[4] == "kernel"
            and len(leaf.get_value().shape) == 2
        ):
            targets[name.removesuffix(".kernel")] = tuple(leaf.get_value().shape)
    return targets


def with_adapters(params, stacks: dict, rows: jax.Array, rank: int):
    """``params`` with each kernel named in ``stacks`` (path -> (a, b), see the module
    docstring) wrapped in a :class:`LoRAKernel` whose rows are ``rows`` [T]. Pure: traced inside
    the jitted step."""

    def wrap(path, leaf):
        name = _dotted(path).removesuffix(".kernel")
        if not _is_variable(leaf) or name not in stacks:
            return leaf
        a, b = stacks[name]
        return leaf.replace(LoRAKernel(leaf.get_value(), a, b, rows, rank))

    return jax.tree_util.tree_map_with_path(wrap, params, is_leaf=_is_variable)


def _is_variable(node) -> bool:
    return isinstance(node, nnx.Variable)


def _dotted(path) -> str:
    return ".".join(str(getattr(key, "key", getattr(key, "name", key))) for key in path)
