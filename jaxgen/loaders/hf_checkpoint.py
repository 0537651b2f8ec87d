"""Hugging Face checkpoint directories: ``config.json`` plus ``*.safetensors`` (sharded index too).

Tensors are read with ``safetensors``' NumPy API straight into host arrays: no torch at run time.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import numpy as np

from jaxgen.config import ModelConfig

INDEX_FILE = "model.safetensors.index.json"


def read_hf_config(path: str) -> dict:
    """The parsed ``config.json`` of a checkpoint directory."""
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"no config.json in checkpoint directory {path!r}")
    with open(config_path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"config.json in {path!r} is not valid JSON: {e}") from None


def safetensors_files(path: str) -> dict[str, str]:
    """Maps each tensor name to the ``.safetensors`` file that holds it."""
    index_path = os.path.join(path, INDEX_FILE)
    if os.path.isfile(index_path):
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
        missing = sorted(
            {f for f in weight_map.values() if not os.path.isfile(os.path.join(path, f))}
        )
        if missing:
            raise FileNotFoundError(f"{INDEX_FILE} in {path!r} names missing shards: {missing}")
        return {name: os.path.join(path, f) for name, f in weight_map.items()}
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in checkpoint directory {path!r}")
    from safetensors import safe_open

    mapping = {}
    for f in files:
        full = os.path.join(path, f)
        with _open_safetensors(safe_open, full) as handle:
            for name in handle.keys():
                mapping[name] = full
    return mapping


def _open_safetensors(safe_open, file: str):
    try:
        return safe_open(file, framework="numpy")
    except Exception as e:  # safetensors raises its own error types for bad headers
        raise ValueError(
            f"cannot read safetensors file {file!r} (truncated or corrupt?): {e}"
        ) from None


def hf_tensor_getter(path: str) -> Callable[[str], np.ndarray]:
    """``get_tensor(name)`` reading one tensor at a time from the checkpoint's safetensors files."""
    from safetensors import safe_open

    files = safetensors_files(path)
    handles: dict[str, object] = {}

    def get(name: str) -> np.ndarray:
        if name not in files:
            if name == "lm_head.weight":
                raise ValueError(
                    f"checkpoint {path!r} has no lm_head.weight and does not tie embeddings"
                )
            raise ValueError(f"checkpoint {path!r} has no tensor {name!r}")
        file = files[name]
        if file not in handles:
            handles[file] = _open_safetensors(safe_open, file)
        try:
            return handles[file].get_tensor(name)
        except Exception as e:
            raise ValueError(
                f"cannot read tensor {name!r} from {file!r} (truncated?): {e}"
            ) from None

    return get


def load_hf_config(path: str) -> ModelConfig:
    """The model config of a checkpoint directory."""
    return ModelConfig.from_hf_dict(read_hf_config(path))
