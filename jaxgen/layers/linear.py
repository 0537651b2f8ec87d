"""Dense layer, and the one matmul entry point models call: any kernel form, no kernel imports.

``Linear`` keeps ``nnx.Linear``'s parameter names (``kernel`` [in, out], ``bias``), so loaders and
sharding rules map it the same way. A backend may run the step on a copy of the parameters whose
kernels it has put in its own form (``KernelBackend.prepare_params``; the "cpu" backend's
panel-packed ``PackedWeight``), so :func:`matmuls` dispatches on the kernel alone:

- a plain array ([in, out]): ``jnp.dot``, every row computed;
- any other object (a ``jaxgen.quantization.QuantizedWeight``: ``x @ dequantize()`` in XLA;
  a backend's packed form): its own ``kernel.matmul(x, live_rows)``, and when every kernel of a group
  (q/k/v, gate/up; :func:`apply_linears`) has the same such type, one
  ``type(kernel).matmul_group(x, kernels, live_rows)`` call (one native job, not several);
  a gated MLP's gate and up may go to one ``type(kernel).matmul_gated(x, gate, up, activation,
  live_rows)`` call (:func:`gated_matmul`), which computes ``act(x @ gate) * (x @ up)``.

``live_rows`` ([2, 2] int32 [begin, end) spans of the real decode and prefill rows) lets such a
kernel skip bucket padding rows, which come out as zeros. The backend owns the kernel and its
matmul, so this module, and the models, import no kernel.

The input may be a :class:`NormedInput`, an RMSNorm not yet computed: a kernel type whose
``norms_input`` is true takes it as ``x`` of its ``matmul`` / ``matmul_gated`` and norms the rows
itself (the pallas-tpu kernels do it in VMEM, so the normed rows never go to HBM and back; the
"cpu" backend's int8 / int4 kernel in a pass before its products, in place of XLA's four small
norm ops); for any other, :func:`matmuls` and :func:`gated_matmul` compute it first, once per
call.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


class Embedding(nnx.Embed):
    """``nnx.Embed`` whose table may also be a quantised kernel.

    A quantised embedding is held as its LM-head kernel (``[hidden, vocab]``, scales grouped
    along hidden; any object with ``take_columns(ids, dtype)`` and a ``matmul``), so the tied LM
    head runs the quantised matmul and the lookup dequantises only the looked-up columns. A
    backend may hold an untied one in a form with ``take_columns`` alone (the pallas-tpu
    backend's row-major ``QuantizedEmbeddingTable``)."""

    def __call__(self, inputs: jax.Array) -> jax.Array:  # [T] -> [T, D]
        table = self.embedding.get_value()
        if isinstance(table, (jax.Array, np.ndarray)):
            return super().__call__(inputs)
        return table.take_columns(inputs, self.dtype or jnp.float32)

    def attend(self, query: jax.Array) -> jax.Array:  # [N, D] -> [N, V]
        table = self.embedding.get_value()
        if isinstance(table, (jax.Array, np.ndarray)):
            return super().attend(query)
        return matmul(query, table)


def kernel_initializer(rngs, **lecun_axes):
    """``nnx.Linear``'s kernel initialiser (LeCun normal over ``lecun_axes``), or a
    ``jax.ShapeDtypeStruct`` when ``rngs`` says the model is built for its shapes alone
    (``shapes_only``: ``jaxgen.models.weights.abstract_causal_lm``, which allocates nothing)."""
    if shapes_only(rngs):
        return shape_only_initializer
    return nnx.initializers.lecun_normal(**lecun_axes)


def zeros_initializer(rngs):
    """Zeros, or a ``jax.ShapeDtypeStruct`` when the model is built for its shapes alone."""
    if shapes_only(rngs):
        return shape_only_initializer
    return lambda key, shape, dtype: jnp.zeros(shape, dtype)


def ones_initializer(rngs):
    """Ones, or a ``jax.ShapeDtypeStruct`` when the model is built for its shapes alone."""
    if shapes_only(rngs):
        return shape_only_initializer
    return lambda key, shape, dtype: jnp.ones(shape, dtype)


def shapes_only(rngs) -> bool:
    """Whether ``rngs`` is ``jaxgen.models.weights.ShapeOnlyKeys``: the model is built for its
    shapes alone. Read from the class: an ``nnx.Rngs`` with a default stream answers any
    attribute with that stream."""
    return getattr(type(rngs), "shapes_only", False)


def shape_only_initializer(key, shape, dtype) -> jax.ShapeDtypeStruct:
    """An initialiser that allocates nothing: the parameter's shape and dtype alone."""
    return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype))


def embedding_table(rows: int, dim: int, *, dtype, rngs) -> Embedding:
    """A ``rows`` x ``dim`` ``Embedding`` held in ``dtype`` (its shape alone when the model is
    built for its shapes alone)."""
    abstract = {"embedding_init": shape_only_initializer} if shapes_only(rngs) else {}
    return Embedding(rows, dim, dtype=dtype, param_dtype=dtype, rngs=rngs, **abstract)


class Linear(nnx.Module):
    """``x @ kernel + bias`` with ``nnx.Linear``'s parameters and initialisers."""

    def __init__(self, n_in: int, n_out: int, *, bias: bool, dtype, rngs: nnx.Rngs):
        init = kernel_initializer(rngs)
        self.kernel = nnx.Param(init(rngs.params(), (n_in, n_out), dtype))  # [in, out]
        self.out_features = n_out
        self.bias = nnx.Param(zeros_initializer(rngs)(None, (n_out,), dtype)) if bias else None

    def __call__(self, x: jax.Array, live_rows: jax.Array | None = None) -> jax.Array:
        """``live_rows``: the rows that are not padding (see the module docstring)."""
        return apply_linears((self,), x, live_rows)[0]


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:  # [..., D]
    """``x / rms(x) * weight`` (computed in float32, scaled in the input's dtype, as HF Llama)."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return xf.astype(x.dtype) * weight


@dataclasses.dataclass(frozen=True)
class NormedInput:
    """``rms_norm(x, weight, eps)``, left for the kernels that read it (module docstring)."""

    x: jax.Array  # [..., D]
    weight: jax.Array  # [D], x's dtype
    eps: float

    @property
    def shape(self) -> tuple[int, ...]:
        return self.x.shape

    @property
    def dtype(self):
        return self.x.dtype

    def value(self) -> jax.Array:
        return rms_norm(self.x, self.weight, self.eps)


def _input_for(x, kinds) -> jax.Array | NormedInput:
    """``x`` as the kernel types ``kinds`` take it: a ``NormedInput`` computed unless all norm
    their input themselves."""
    if isinstance(x, NormedInput) and not all(getattr(k, "norms_input", False) for k in kinds):
        return x.value()
    return x


def matmul(x: jax.Array, kernel, live_rows: jax.Array | None = None) -> jax.Array:
    """``x @ kernel`` for a kernel in any form (see the module docstring)."""
    if isinstance(kernel, (jax.Array, np.ndarray)):
        return jnp.dot(x, kernel)
    return kernel.matmul(x, live_rows)


def gated_matmul(x, gate, up, activation: str, live_rows=None) -> jax.Array | None:
    """``act(x @ gate) * (x @ up)`` in one call when both kernels are of one type that has a
    ``matmul_gated`` and it takes them; None otherwise (the caller computes it itself)."""
    kind = type(gate)
    if type(up) is not kind or not hasattr(kind, "matmul_gated"):
        return None
    return kind.matmul_gated(_input_for(x, [kind]), gate, up, activation, live_rows)


def matmuls(x, kernels: list, live_rows: jax.Array | None = None) -> list[jax.Array]:
    """``[x @ kernel for kernel in kernels]``; one ``matmul_group`` call when every kernel is the
    same non-array type that has one."""
    x = _input_for(x, [type(kernel) for kernel in kernels])
    kind = type(kernels[0])
    if hasattr(kind, "matmul_group") and all(type(kernel) is kind for kernel in kernels):
        return list(kind.matmul_group(x, kernels, live_rows))
    return [matmul(x, kernel, live_rows) for kernel in kernels]


def apply_linears(
    layers: tuple[Linear, ...], x: jax.Array, live_rows: jax.Array | None = None
) -> list[jax.Array]:
    """``[layer(x) for layer in layers]`` with their kernels' matmuls grouped (:func:`matmuls`)."""
    outputs = matmuls(x, [layer.kernel.get_value() for layer in layers], live_rows)
    return [
        y if layer.bias is None else y + layer.bias[...]
        for layer, y in zip(layers, outputs, strict=True)
    ]
