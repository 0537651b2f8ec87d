"""Phi-3: fused ``qkv_proj`` and ``gate_up_proj`` (split at load, GGUF's too), LongRoPE (``su``
and ``yarn`` its old names), and a sliding window over every layer."""

from __future__ import annotations

import numpy as np

from jaxgen.families.checkpoint_names import LEAF, hf_name, read_llama_named, torch_layout
from jaxgen.families.family import ModelFamily
from jaxgen.families.gguf_names import gguf_config, gguf_tensor_name
from jaxgen.families.hf_fields import decoder_fields, sliding_layers

GGUF_LAYER_NAMES = {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
ROPE_ALIASES = {"su": "longrope", "yarn": "longrope"}


def config_fields(hf: dict) -> dict:
    return decoder_fields(hf, "phi3", sliding=sliding_layers(hf), rope_aliases=ROPE_ALIASES)


def fused_rows(config, path: tuple) -> tuple[str, int, int] | None:
    """(fused tensor, first row, end row) of a projection split at load; None for the rest."""
    if len(path) != 5:
        return None
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
    return f"model.layers.{layer}.{module}.{fused}.{LEAF[path[-1]]}", *rows


def read_parameter(config, path: tuple, get) -> np.ndarray:
    fused = fused_rows(config, path)
    if fused is None:
        return read_llama_named(config, path, get)
    name, start, stop = fused
    return torch_layout(path, np.asarray(get(name))[start:stop])


def direct_name(config, path: tuple) -> str | None:
    return None if fused_rows(config, path) else hf_name(path)


def phi3_gguf_config(gguf) -> dict:
    """The common fields, and LongRoPE's factors (stored as tensors) and original context."""
    config = gguf_config(gguf, "phi3")
    if "rope_factors_long.weight" not in gguf.tensors:
        return config
    original = gguf.arch_field("rope.scaling.original_context_length")
    config["rope_scaling"] = {
        "rope_type": "longrope",
        "long_factor": gguf.get_tensor("rope_factors_long.weight").tolist(),
        "short_factor": gguf.get_tensor("rope_factors_short.weight").tolist(),
        "original_max_position_embeddings": original,
        "attention_factor": gguf.arch_field("rope.scaling.attn_factor"),
    }
    config["original_max_position_embeddings"] = original
    return config


def phi3_gguf_name(name: str, gguf_names: set[str]) -> str:
    return gguf_tensor_name(name, gguf_names, GGUF_LAYER_NAMES)


FAMILY = ModelFamily(
    model_type="phi3",
    architectures=("Phi3ForCausalLM",),
    config_fields=config_fields,
    read_parameter=read_parameter,
    direct_name=direct_name,
    gguf_architecture="phi3",
    gguf_config=phi3_gguf_config,
    gguf_tensor_name=phi3_gguf_name,
)
