"""Hugging Face tensors (``{name: array}``, torch layout) to the Flax model's parameter state."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxgen.config import ModelConfig
from jaxgen.models.linear import Embedding
from jaxgen.models.llama import LlamaForCausalLM
from jaxgen.models.rope import inverse_frequencies
from jaxgen.quantization import QuantizedWeight, quantize_kernel, spec_for_path

ArrayPlacer = Callable[[tuple, np.ndarray], jax.Array]
QuantizedGetter = Callable[[str], QuantizedWeight | None]


def abstract_model(config: ModelConfig, dtype) -> tuple[nnx.GraphDef, nnx.State]:
    """The model's graph and an abstract state (shapes only), without allocating weights."""
    model = nnx.eval_shape(lambda: LlamaForCausalLM(config, dtype=dtype, rngs=nnx.Rngs(0)))
    return nnx.split(model)


def hf_name(path: tuple) -> str | None:
    """HF tensor name for a state path such as ``('layers', 0, 'self_attn', 'q_proj', 'kernel')``."""
    if path == ("inv_freq",):
        return None
    if path[0] == "lm_head":
        return "lm_head.weight" if path[-1] == "kernel" else "lm_head.bias"
    parts = [str(p) for p in path[:-1]]
    leaf = {"kernel": "weight", "embedding": "weight", "weight": "weight", "bias": "bias"}[path[-1]]
    return "model." + ".".join(parts + [leaf])


def params_from_hf_tensors(
    config: ModelConfig,
    get_tensor: Callable[[str], np.ndarray],
    *,
    dtype=jnp.float32,
    place: ArrayPlacer | None = None,
    quantization: str = "none",
    get_quantized: QuantizedGetter | None = None,
) -> tuple[nnx.GraphDef, nnx.State]:
    """Builds the parameter state by pulling each HF tensor through ``get_tensor(name)``.

    ``place(path, array)`` puts each converted array on device (default: ``jnp.asarray``), so a
    sharded loader can place slices without materialising the whole tensor everywhere.
    Quantisable parameters (every ``Linear`` kernel, and an ``Embedding`` table, held then as
    its ``[hidden, vocab]`` head kernel) become ``QuantizedWeight``s: as the checkpoint stores
    them when ``get_quantized(name)`` returns one (a GGUF's Q8_0/Q4_0/Q4_1 under
    ``quantization="auto"``), else quantised at load when ``quantization`` names a kind
    (``jaxgen.quantization.spec_for_path``).
    """
    graphdef, abstract = abstract_model(config, dtype)
    place = place or (lambda path, arr: jnp.asarray(arr))
    quantisable = quantisable_paths(config, dtype)
    flat = nnx.to_flat_state(abstract)
    leaves = []
    for path, var in flat:
        if path == ("inv_freq",):
            leaves.append((path, var.replace(jnp.asarray(inverse_frequencies(config)))))
            continue
        name = hf_name(path)
        expected = tuple(var.get_value().shape)
        if path in quantisable:
            kernel_shape = expected if path[-1] == "kernel" else expected[::-1]  # [in, out]
            weight = _quantized(path, name, kernel_shape, quantization, get_tensor, get_quantized)
            if weight is not None:
                leaves.append((path, var.replace(jax.tree.map(jnp.asarray, weight))))
                continue
        arr = np.asarray(get_tensor(name))
        if path[-1] == "kernel":
            arr = arr.T  # torch Linear weight [out, in] -> Flax kernel [in, out]
        if tuple(arr.shape) != expected:
            raise ValueError(f"tensor {name!r} has shape {arr.shape}, expected {expected}")
        arr = arr.astype(jnp.dtype(dtype))
        leaves.append((path, var.replace(place(path, arr))))
    return graphdef, nnx.from_flat_state(leaves)


def quantisable_paths(config: ModelConfig, dtype=jnp.float32) -> set[tuple]:
    """State paths of the parameters a quantised load may quantise: ``Linear`` kernels and
    ``Embedding`` tables (whose lookup takes a quantised table)."""
    model = nnx.eval_shape(lambda: LlamaForCausalLM(config, dtype=dtype, rngs=nnx.Rngs(0)))
    paths = set()
    for path, module in nnx.iter_modules(model):
        if isinstance(module, Embedding):
            paths.add((*path, "embedding"))
    for path, _ in nnx.to_flat_state(nnx.state(model)):
        if path[-1] == "kernel":
            paths.add(path)
    return paths


def _quantized(path, name, kernel_shape, quantization, get_tensor, get_quantized):
    """The ``QuantizedWeight`` for a quantisable parameter, or None (it stays float)."""
    weight = None
    if quantization == "auto" and get_quantized is not None:
        weight = get_quantized(name)
    spec = spec_for_path(quantization, path)
    if weight is None and spec is not None:
        weight = quantize_kernel(np.asarray(get_tensor(name), np.float32).T, spec)
    if weight is not None and tuple(weight.shape) != tuple(kernel_shape):
        raise ValueError(f"tensor {name!r} has shape {weight.shape}, expected {kernel_shape}")
    return weight


def required_tensor_names(config: ModelConfig) -> list[str]:
    """Names of every HF tensor the model needs."""
    _, abstract = abstract_model(config, jnp.float32)
    return [n for n in (hf_name(p) for p, _ in nnx.to_flat_state(abstract)) if n is not None]


def tensors_getter(tensors: Mapping[str, np.ndarray]) -> Callable[[str], np.ndarray]:
    """``get_tensor`` over an in-memory mapping, with a clear error for a missing tensor."""

    def get(name: str) -> np.ndarray:
        if name not in tensors:
            raise ValueError(f"checkpoint has no tensor {name!r}")
        return tensors[name]

    return get
