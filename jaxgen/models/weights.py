"""Hugging Face tensors (``{name: array}``, torch layout) to the Flax model's parameter state.

Our parameter paths follow the Llama names for every family (``layers.3.self_attn.q_proj``,
``layers.3.mlp.down_proj``), so the sharding rules and kernels see one vocabulary. This module
maps each path to the family's checkpoint tensors (:func:`read_parameter`), which is where
fused tensors are split (Phi-3's ``qkv_proj``/``gate_up_proj``, Falcon's ``query_key_value``)
and per-expert tensors stacked (Mixtral, Qwen3-MoE).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxgen.config import ModelConfig
from jaxgen.layers.linear import Embedding
from jaxgen.layers.rope import rope_buffers
from jaxgen.models.causal_lm import CausalLM
from jaxgen.quantization import QuantizedWeight, quantize_kernel, spec_for_path
from jaxgen.quantization.quantize import with_int8_activations

ArrayPlacer = Callable[[tuple, np.ndarray], jax.Array]
TensorGetter = Callable[[str], np.ndarray]
QuantizedGetter = Callable[[str], QuantizedWeight | None]

_LEAF = {"kernel": "weight", "embedding": "weight", "weight": "weight", "bias": "bias"}
# Our expert parameter -> (Mixtral's, Qwen3-MoE's) per-expert tensor name.
_EXPERT_NAMES = {
    "gate_proj": ("w1", "gate_proj"),
    "up_proj": ("w3", "up_proj"),
    "down_proj": ("w2", "down_proj"),
}
# Falcon: our module path -> its tensor's module path, within a layer.
_FALCON_LAYER = {
    "self_attn.o_proj": "self_attention.dense",
    "mlp.up_proj": "mlp.dense_h_to_4h",
    "mlp.down_proj": "mlp.dense_4h_to_h",
}


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


def hf_name(path: tuple) -> str | None:
    """HF tensor name of a Llama-named path such as ``('layers', 0, 'self_attn', 'q_proj',
    'kernel')`` (None for RoPE tables, which are computed)."""
    if path[-1].endswith("inv_freq"):
        return None
    if path[0] == "lm_head":
        return "lm_head.weight" if path[-1] == "kernel" else "lm_head.bias"
    parts = [str(p) for p in path[:-1]]
    return "model." + ".".join(parts + [_LEAF[path[-1]]])


def _torch_layout(path: tuple, array: np.ndarray) -> np.ndarray:
    """torch Linear weight [out, in] -> Flax kernel [in, out]."""
    return array.T if path[-1] == "kernel" else array


def read_parameter(config: ModelConfig, path: tuple, get: TensorGetter) -> np.ndarray:
    """The array of parameter ``path`` in our layout, read from the family's checkpoint names."""
    family = config.model_type
    if family == "falcon":
        return _falcon_parameter(config, path, get)
    if len(path) > 3 and path[2] == "mlp" and path[3] in ("router", "experts"):
        return _moe_parameter(config, path, get)
    if family == "phi3" and len(path) == 5:
        fused = _phi3_fused(config, path)
        if fused is not None:
            name, start, stop = fused
            return _torch_layout(path, np.asarray(get(name))[start:stop])
    return _torch_layout(path, np.asarray(get(hf_name(path))))


def _moe_parameter(config: ModelConfig, path: tuple, get: TensorGetter) -> np.ndarray:
    layer, kind = path[1], path[3]
    block = "block_sparse_moe" if config.model_type == "mixtral" else "mlp"
    prefix = f"model.layers.{layer}.{block}"
    if kind == "router":
        return np.asarray(get(f"{prefix}.gate.weight")).T
    name = _EXPERT_NAMES[path[4]][0 if config.model_type == "mixtral" else 1]
    return np.stack(
        [
            np.asarray(get(f"{prefix}.experts.{e}.{name}.weight")).T
            for e in range(config.moe.num_experts)
        ]
    )


def _phi3_fused(config: ModelConfig, path: tuple) -> tuple[str, int, int] | None:
    """(fused tensor, first row, end row) of a Phi-3 projection split at load."""
    layer, module, proj = path[1], path[2], path[3]
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    f = config.intermediate_size
    rows = {
        ("self_attn", "q_proj"): (0, q),
        ("self_attn", "k_proj"): (q, q + kv),
        ("self_attn", "v_proj"): (q + kv, q + 2 * kv),
        ("mlp", "gate_proj"): (0, f),
        ("mlp", "up_proj"): (f, 2 * f),
    }.get((module, proj))
    if rows is None:
        return None
    fused = "qkv_proj" if module == "self_attn" else "gate_up_proj"
    return f"model.layers.{layer}.{module}.{fused}.{_LEAF[path[-1]]}", *rows


def _falcon_parameter(config: ModelConfig, path: tuple, get: TensorGetter) -> np.ndarray:
    leaf = _LEAF[path[-1]]
    if path[0] == "embed_tokens":
        return np.asarray(get("transformer.word_embeddings.weight"))
    if path[0] == "norm":
        return np.asarray(get(f"transformer.ln_f.{leaf}"))
    if path[0] == "lm_head":
        return np.asarray(get("lm_head.weight")).T
    layer, module = path[1], ".".join(str(p) for p in path[2:-1])
    prefix = f"transformer.h.{layer}"
    if module in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
        fused = np.asarray(get(f"{prefix}.self_attention.query_key_value.{leaf}"))
        return _torch_layout(path, _split_falcon_qkv(config, fused, module[-6]))
    if module == "input_layernorm":
        name = "ln_attn" if config.num_parallel_norms == 2 else "input_layernorm"
    elif module == "mlp_layernorm":
        name = "ln_mlp" if config.parallel_attention else "post_attention_layernorm"
    else:
        name = _FALCON_LAYER[module]
    return _torch_layout(path, np.asarray(get(f"{prefix}.{name}.{leaf}")))


def _split_falcon_qkv(config: ModelConfig, fused: np.ndarray, which: str) -> np.ndarray:
    """Rows of ``q``, ``k`` or ``v`` from Falcon's fused QKV: per KV head, its group of query
    heads, then one key head, then one value head (this covers multi-query, whose single group
    is every query head, and the old per-head q/k/v interleave, whose groups are one head)."""
    kv, hd = config.num_kv_heads, config.head_dim
    group = config.num_heads // kv
    grouped = fused.reshape(kv, group + 2, hd, *fused.shape[1:])
    part = {"q": grouped[:, :group], "k": grouped[:, group : group + 1], "v": grouped[:, -1:]}
    selected = part[which]
    return selected.reshape(-1, *fused.shape[1:])


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
    name = _direct_name(config, path)
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


def _direct_name(config: ModelConfig, path: tuple) -> str | None:
    """The checkpoint tensor that is exactly parameter ``path`` (None when the family renames,
    splits or stacks it: Falcon, Phi-3's fused projections, experts)."""
    if config.model_type == "falcon" or (len(path) > 3 and path[3] in ("router", "experts")):
        return None
    if config.model_type == "phi3" and len(path) == 5 and _phi3_fused(config, path):
        return None
    return hf_name(path)


def tensors_getter(tensors: Mapping[str, np.ndarray]) -> TensorGetter:
    """``get_tensor`` over an in-memory mapping, with a clear error for a missing tensor."""

    def get(name: str) -> np.ndarray:
        if name not in tensors:
            raise ValueError(f"checkpoint has no tensor {name!r}")
        return tensors[name]

    return get
