"""Our parameter paths and the Hugging Face tensors they come from, for the families that keep
the Llama names (``model.layers.3.self_attn.q_proj.weight``).

Our paths follow the Llama names for every family (``layers.3.self_attn.q_proj.kernel``), so
the sharding rules and the kernels see one vocabulary; a family that names, fuses or stacks
its tensors otherwise says so in its own ``read_parameter`` and ``direct_name``."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

TensorGetter = Callable[[str], np.ndarray]

LEAF = {"kernel": "weight", "embedding": "weight", "weight": "weight", "bias": "bias"}


def hf_name(path: tuple) -> str | None:
    """HF tensor name of a Llama-named path such as ``('layers', 0, 'self_attn', 'q_proj',
    'kernel')`` (None for RoPE tables, which are computed)."""
    if path[-1].endswith("inv_freq"):
        return None
    if path[0] == "lm_head":
        return "lm_head.weight" if path[-1] == "kernel" else "lm_head.bias"
    parts = [str(p) for p in path[:-1]]
    return "model." + ".".join(parts + [LEAF[path[-1]]])


def torch_layout(path: tuple, array: np.ndarray) -> np.ndarray:
    """torch Linear weight [out, in] -> Flax kernel [in, out]."""
    return array.T if path[-1] == "kernel" else array


def read_llama_named(config, path: tuple, get: TensorGetter) -> np.ndarray:
    """The array of parameter ``path`` in our layout, from its Llama-named tensor."""
    return torch_layout(path, np.asarray(get(hf_name(path))))


def llama_direct_name(config, path: tuple) -> str | None:
    """The one checkpoint tensor that is exactly parameter ``path``."""
    return hf_name(path)
