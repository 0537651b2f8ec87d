"""A PEFT LoRA adapter read from disk (``adapter_config.json`` + ``adapter_model.safetensors``)
and checked against the base model's projections, before any of it reaches a device slot.

Each targeted projection becomes ``A`` [in, r] (``lora_A.weight`` transposed) and ``B`` [r, out]
(``lora_B.weight`` transposed, times the adapter's scaling: ``lora_alpha / r``, or
``lora_alpha / sqrt(r)`` with ``use_rslora``, r the module's rank as PEFT computes it). Anything
the engine cannot run as PEFT would is a ``ValueError`` naming it: a missing path, a rank over
``max_lora_rank``, a module the model lacks (or a layer past its last), a shape of another base
model, ``modules_to_save``, DoRA, LoRA biases, ``fan_in_fan_out``, ``alpha_pattern``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re

import numpy as np

from jaxgen.layers.lora import TARGET_MODULES

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight (an adapter name may follow A/B)
TENSOR_NAME = re.compile(r"(?:.*\.)?layers\.(\d+)\.(\w+)\.(\w+)\.lora_([AB])(?:\.[\w-]+)?\.weight")


@dataclasses.dataclass(frozen=True)
class PeftAdapter:
    """An adapter's weights by target path (``jaxgen.layers.lora.target_path``)."""

    name: str
    lora_int_id: int
    rank: int  # the largest rank of its modules
    weights: dict[str, tuple[np.ndarray, np.ndarray]]  # path -> (A [in, r], scaled B [r, out])

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())


def read_peft_adapter(request, targets: dict[str, tuple[int, int]], max_rank: int) -> PeftAdapter:
    """Reads and checks the adapter of ``request`` (a ``LoRARequest``) against ``targets`` (the
    model's projections: path -> (in, out), ``jaxgen.layers.lora.lora_targets``). Raises
    ``ValueError`` naming the adapter and what does not fit."""
    name, path = request.lora_name, request.lora_path
    where = f"LoRA adapter {name!r} ({path!r})"
    if not os.path.isdir(path):
        raise ValueError(f"lora_path of {where}: no such directory")
    config = _read_config(path, where)
    alpha, use_rslora = _check_config(config, where, max_rank)
    tensors = _read_tensors(os.path.join(path, WEIGHTS_FILE), where)
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for tensor_name, value in tensors.items():
        match = TENSOR_NAME.fullmatch(tensor_name)
        if match is None:
            raise ValueError(f"{where}: tensor {tensor_name!r} is not a LoRA A/B of a projection")
        layer, block, module, side = match.groups()
        if TARGET_MODULES.get(module) != block:
            raise ValueError(f"{where}: target module {module!r} which the model lacks")
        target = f"layers.{layer}.{block}.{module}"
        if target not in targets:
            raise ValueError(f"{where}: target module {target!r} which the model lacks")
        pairs.setdefault(target, {})[side] = value
    weights = {}
    for target, pair in pairs.items():
        weights[target] = _module_weights(target, pair, targets[target], alpha, use_rslora, where)
        if weights[target][0].shape[1] > max_rank:
            rank = weights[target][0].shape[1]
            raise ValueError(f"{where}: {target} has rank {rank} > max_lora_rank={max_rank}")
    if not weights:
        raise ValueError(f"{where}: {WEIGHTS_FILE} holds no LoRA weights")
    rank = max(a.shape[1] for a, _ in weights.values())
    return PeftAdapter(name, request.lora_int_id, rank, weights)


def _read_config(path: str, where: str) -> dict:
    file = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(file):
        raise ValueError(f"{where}: no {CONFIG_FILE}")
    try:
        with open(file, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as error:
        raise ValueError(f"{where}: cannot read {CONFIG_FILE}: {error}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{where}: {CONFIG_FILE} is not a JSON object")
    return config


def _check_config(config: dict, where: str, max_rank: int) -> tuple[float, bool]:
    """``(lora_alpha, use_rslora)`` of a PEFT LoRA config the engine runs as PEFT does."""
    peft_type = config.get("peft_type", "LORA")
    if str(peft_type).upper() != "LORA":
        raise ValueError(f"{where}: peft_type {peft_type!r} is not LORA")
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"{where}: r must be an integer >= 1, got {rank!r}")
    if rank > max_rank:
        raise ValueError(f"{where}: rank r={rank} > max_lora_rank={max_rank}")
    refused = {
        "modules_to_save": "modules_to_save (fully trained modules) is not supported",
        "use_dora": "DoRA (use_dora) is not supported",
        "fan_in_fan_out": "fan_in_fan_out (Conv1D weights) is not supported",
        "alpha_pattern": "alpha_pattern is not supported",
        "lora_bias": "lora_bias is not supported",
    }
    for key, why in refused.items():
        if config.get(key):
            raise ValueError(f"{where}: {why}")
    if config.get("bias", "none") != "none":
        raise ValueError(f"{where}: bias {config['bias']!r} is not supported (only 'none')")
    targets = config.get("target_modules")
    if isinstance(targets, list):
        for module in targets:
            if module not in TARGET_MODULES:
                raise ValueError(f"{where}: target module {module!r} which the model lacks")
    alpha = config.get("lora_alpha", 8)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise ValueError(f"{where}: lora_alpha must be a number, got {alpha!r}")
    return float(alpha), bool(config.get("use_rslora", False))


def _read_tensors(file: str, where: str) -> dict[str, np.ndarray]:
    if not os.path.isfile(file):
        raise ValueError(f"{where}: no {WEIGHTS_FILE}")
    from safetensors import safe_open

    try:
        with safe_open(file, framework="numpy") as handle:
            return {key: handle.get_tensor(key) for key in handle.keys()}
    except Exception as error:  # safetensors raises its own error types
        raise ValueError(f"{where}: cannot read {WEIGHTS_FILE}: {error}") from None


def _module_weights(target, pair, shape, alpha, use_rslora, where):
    """One module's ``(A [in, r], scaled B [r, out])`` in float32, its shapes checked."""
    if set(pair) != {"A", "B"}:
        raise ValueError(f"{where}: {target} lacks lora_{'B' if 'A' in pair else 'A'}")
    lora_a, lora_b = (np.asarray(pair[side]).astype(np.float32) for side in ("A", "B"))
    n_in, n_out = shape
    rank = lora_a.shape[0]
    if lora_a.shape != (rank, n_in) or lora_b.shape != (n_out, rank):
        raise ValueError(
            f"{where}: {target} does not fit the base model (lora_A {lora_a.shape}, lora_B "
            f"{lora_b.shape}; the model's projection is {n_in} -> {n_out}): another base model?"
        )
    scaling = alpha / math.sqrt(rank) if use_rslora else alpha / rank
    return np.ascontiguousarray(lora_a.T), np.ascontiguousarray(lora_b.T * scaling)
