"""Hugging Face tensors (``{name: array}``, torch layout) to the Flax model's parameter state.

Our parameter paths follow the Llama names for every family (``layers.3.self_attn.q_proj``,
``layers.3.mlp.down_proj``), so the sharding rules and kernels see one vocabulary; each family's
module (``jaxgen.families``) maps a path to its checkpoint's tensors (its ``read_parameter``:
where Phi-3's and Falcon's fused tensors are split and experts stacked) and says which are
one tensor each (its ``direct_name``: those a quantised checkpoint keeps as they are).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxgen.config import ModelConfig
from jaxgen.families import family_of
from jaxgen.families.checkpoint_names import TensorGetter
from jaxgen.layers.linear import Embedding
from jaxgen.layers.rope import rope_buffers
from jaxgen.models.causal_lm import CausalLM
from jaxgen.quantization import QuantizedWeight, quantize_kernel, spec_for_path
from jaxgen.quantization.quantize import with_int8_activations

ArrayPlacer = Callable[[tuple, np.ndarray], jax.Array]
QuantizedGetter = Callable[[str], QuantizedWeight | None]


class ShapeOnlyKeys:
    """Stands in for ``nnx.Rngs`` when a model is built for its shapes alone: every draw is
    the same abstract key (no initialiser draws from it: making a real one costs a dispatch of
    several primitives, ~0.05 s of a start-up), and the layers' initialisers
    (``jaxgen.layers.linear.kernel_initializer``) give ``jax.ShapeDtypeStruct``s instead of
    arrays, so the model is built without tracing (``nnx.eval_shape`` traced every
    initialiser: 0.7 s and more for the 30-layer default model on a CPU) and without
    allocating its weights."""

    shapes_only = True
    _KEY = jax.ShapeDtypeStruct((2,), jnp.uint32)  # a raw threefry key's shape

    def params(self) -> jax.ShapeDtypeStruct:
        return self._KEY

    def __call__(self) -> jax.ShapeDtypeStruct:
        return self._KEY


def abstract_causal_lm(config: ModelConfig, dtype) -> CausalLM:
    """The model with abstract (``ShapeDtypeStruct``) parameters, built without allocating
    weights: the large ones are shapes from the start, the small ones a layer makes itself
    (norm scales, RoPE tables) are replaced by their shapes."""
    return nnx.merge(*abstract_model(config, dtype))


def _shape_of(leaf) -> jax.ShapeDtypeStruct:
    return (
        leaf
        if isinstance(leaf, jax.ShapeDtypeStruct)
        else jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
    )


def abstract_model(config: ModelConfig, dtype) -> tuple[nnx.GraphDef, nnx.State]:
    """The model's graph and an abstract state (shapes only), without allocating weights."""
    graphdef, state, _ = _abstract_model_and_quantisable(config, dtype)
    return graphdef, state


def _abstract_model_and_quantisable(
    config: ModelConfig, dtype
) -> tuple[nnx.GraphDef, nnx.State, set[tuple]]:
    """``abstract_model`` and the quantisable paths, from one build and one split of the model
    (building it is most of a load's Python time on a CPU)."""
    model = CausalLM(config, dtype=dtype, rngs=ShapeOnlyKeys())
    graphdef, state = nnx.split(model)
    state = jax.tree.map(_shape_of, state)
    quantisable = set()
    for path, _ in nnx.to_flat_state(state):
        if path[-1] == "kernel" or (
            path[-1] == "embedding" and isinstance(_module_at(model, path[:-1]), Embedding)
        ):
            quantisable.add(path)
    return graphdef, state, quantisable


def _module_at(model: nnx.Module, path: tuple) -> object:
    """The submodule at ``path`` (attribute names and list indices); a look-up per parameter is
    cheaper than walking every module (``nnx.iter_modules``)."""
    module = model
    for part in path:
        module = module[part] if isinstance(part, int) else getattr(module, part)
    return module


def read_parameter(config: ModelConfig, path: tuple, get: TensorGetter) -> np.ndarray:
    """The array of parameter ``path`` in our layout, read from the family's checkpoint names
    (its ``read_parameter``)."""
    return family_of(config.model_type).read_parameter(config, path, get)


def params_from_hf_tensors(
    config: ModelConfig,
    get_tensor: TensorGetter,
    *,
    dtype=jnp.float32,
    place: ArrayPlacer | None = None,
    quantization: str = "none",
    get_quantized: QuantizedGetter | None = None,
) -> tuple[nnx.GraphDef, nnx.State]:
    """Builds the parameter state by pulling each HF tensor through ``get_tensor(name)``.

    ``place(path, array)`` puts each converted array on device (default: one ``jax.device_put``
    for all of them), so a
    sharded loader can place slices without materialising the whole tensor everywhere; a
    ``place`` with a ``place_quantized(path, weight)`` method (a ``ShardingPlan``) places the
    ``QuantizedWeight``s too, each leaf split as its float kernel would be.
    Quantisable parameters (every ``Linear`` kernel, and an ``Embedding`` table, held then as
    its ``[hidden, vocab]`` head kernel) become ``QuantizedWeight``s: as the checkpoint stores
    them when ``get_quantized(name)`` returns one (a GGUF's kept types under
    ``quantization="auto"``, or ``"w4a8"`` with int8 activations), else quantised at load when
    ``quantization`` names a kind (``jaxgen.quantization.spec_for_path``).
    """
    graphdef, abstract, quantisable = _abstract_model_and_quantisable(config, dtype)
    place_quantized = getattr(place, "place_quantized", None)  # a sharding plan's
    buffers = rope_buffers(config)
    leaves = []  # [path, variable, value]
    transfer = _BatchedTransfer(leaves)
    for path, var in nnx.to_flat_state(abstract):
        if len(path) == 1 and path[0] in buffers:
            leaves.append([path, var, jnp.asarray(buffers[path[0]])])
            continue
        expected = tuple(var.get_value().shape)
        if path in quantisable:
            kernel_shape = expected if path[-1] == "kernel" else expected[::-1]  # [in, out]
            weight = _quantized(config, path, kernel_shape, quantization, get_tensor, get_quantized)
            if weight is not None:
                if place_quantized is not None:
                    leaves.append([path, var, place_quantized(path, weight)])
                else:
                    transfer.add([path, var, weight])
                continue
        arr = read_parameter(config, path, get_tensor)
        if tuple(arr.shape) != expected:
            raise ValueError(
                f"parameter {'.'.join(map(str, path))!r} read from the checkpoint has shape "
                f"{arr.shape}, expected {expected}"
            )
        arr = arr.astype(jnp.dtype(dtype))
        if place is None:
            transfer.add([path, var, arr])
        else:
            leaves.append([path, var, place(path, arr)])
    transfer.flush()
    return graphdef, nnx.from_flat_state(
        [(path, var.replace(value)) for path, var, value in leaves]
    )


class _BatchedTransfer:
    """Host values put on the device by one ``jax.device_put`` per ``BATCH_BYTES`` of host
    copies (a call per array costs ~0.4 ms of dispatch; the default model has 211 of them), so
    at most that much host memory waits for its transfer. Read-only values (memory-mapped
    views of the GGUF weights cache) are held elsewhere anyway and do not count."""

    BATCH_BYTES = 256 << 20

    def __init__(self, leaves: list):
        self._leaves = leaves
        self._pending: list[int] = []  # indices into leaves
        self._bytes = 0

    def add(self, leaf: list) -> None:
        """Appends ``leaf`` (``[path, variable, host value]``) to the leaves; its value is
        replaced by the device value at the next flush."""
        self._leaves.append(leaf)
        self._pending.append(len(self._leaves) - 1)
        self._bytes += sum(
            array.nbytes
            for array in jax.tree_util.tree_leaves(leaf[2])
            if isinstance(array, np.ndarray) and array.flags.writeable
        )
        if self._bytes >= self.BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        values = jax.device_put([self._leaves[index][2] for index in self._pending])
        for index, value in zip(self._pending, values, strict=True):
            self._leaves[index][2] = value
        self._pending, self._bytes = [], 0


def quantisable_paths(config: ModelConfig, dtype=jnp.float32) -> set[tuple]:
    """State paths of the parameters a quantised load may quantise: ``Linear`` kernels and
    ``Embedding`` tables (whose lookup takes a quantised table)."""
    return _abstract_model_and_quantisable(config, dtype)[2]


def _quantized(config, path, kernel_shape, quantization, get_tensor, get_quantized):
    """The ``QuantizedWeight`` for a quantisable parameter, or None (it stays float): as the
    checkpoint stores it when one tensor holds exactly this parameter, else quantised from its
    float array when ``quantization`` names a kind."""
    weight = None
    name = family_of(config.model_type).direct_name(config, path)
    if quantization in ("auto", "w4a8") and get_quantized is not None and name is not None:
        weight = get_quantized(name)  # kept as the checkpoint stores it
        if weight is not None and quantization == "w4a8":
            weight = with_int8_activations(weight)
    spec = spec_for_path(quantization, path)
    if weight is None and spec is not None:
        array = np.asarray(read_parameter(config, path, get_tensor), np.float32)
        weight = quantize_kernel(array if path[-1] == "kernel" else array.T, spec)  # [in, out]
    if weight is not None and tuple(weight.shape) != tuple(kernel_shape):
        label = ".".join(map(str, path))
        raise ValueError(f"parameter {label!r} has shape {weight.shape}, expected {kernel_shape}")
    return weight


def tensors_getter(tensors: Mapping[str, np.ndarray]) -> TensorGetter:
    """``get_tensor`` over an in-memory mapping, with a clear error for a missing tensor."""

    def get(name: str) -> np.ndarray:
        if name not in tensors:
            raise ValueError(f"checkpoint has no tensor {name!r}")
        return tensors[name]

    return get
