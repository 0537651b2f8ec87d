"""What a loaded model's weights are stored as: kinds, parameter counts and bytes."""

from __future__ import annotations

import math

import jax
import numpy as np
from flax import nnx

from jaxgen.quantization.quantized_weight import QuantizedWeight


def weight_stats(loaded) -> dict:
    """``quantization`` (as loaded), ``weight_dtypes`` ({kind or dtype: parameter count}) and
    ``parameter_bytes`` (every stored leaf: values, scales, minimums, float parameters; the
    same while the weights sleep)."""
    kinds: dict[str, int] = {}
    total = 0
    for _, var in nnx.to_flat_state(loaded.params):
        value = var.get_value()
        if isinstance(value, QuantizedWeight):
            name = value.kind if value.mins is None else f"{value.kind}+min"
            name += "+codebook" if value.codebook is not None else ""
            name += f"/g{value.group_size}" if value.group_size < value.shape[0] else "/channel"
            name += {"int8": "/a8", "int16": "/a16"}.get(value.activations, "")
            count = math.prod(value.shape)
        else:
            name, count = str(value.dtype), math.prod(value.shape)
        kinds[name] = kinds.get(name, 0) + count
        total += sum(_nbytes(leaf) for leaf in jax.tree_util.tree_leaves(value))
    return {
        "quantization": getattr(loaded, "quantization", "none"),
        "weight_dtypes": kinds,
        "parameter_bytes": total,
    }


def _nbytes(leaf) -> int:
    """An array's bytes, or a ``jax.ShapeDtypeStruct``'s (a sleeping engine's parameters)."""
    return math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize
