"""Qwen3-MoE and Qwen2-MoE: experts under ``mlp`` (``gate_proj``/``up_proj``/``down_proj``),
dense layers where ``decoder_sparse_step`` and ``mlp_only_layers`` say; Qwen3-MoE's q/k norms,
Qwen2-MoE's Q/K/V biases and shared expert."""

from __future__ import annotations

from jaxgen.families.experts import EXPERT_AXES, ExpertNames
from jaxgen.families.family import ModelFamily
from jaxgen.families.gguf_names import gguf_config
from jaxgen.families.hf_fields import decoder_fields, qwen_window_layers, sliding_layers
from jaxgen.families.qwen3 import QK_NORM_AXES

NAMES = ExpertNames("mlp", ("gate_proj", "up_proj", "down_proj"))


def moe_fields(hf: dict) -> dict:
    num_layers = hf["num_hidden_layers"]
    step = hf.get("decoder_sparse_step", 1) or 1
    only = set(hf.get("mlp_only_layers") or ())
    return dict(
        num_experts=hf.get("num_local_experts") or hf.get("num_experts"),
        num_experts_per_token=hf.get("num_experts_per_tok", 8),
        expert_size=hf["moe_intermediate_size"],
        norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
        shared_expert_size=int(hf.get("shared_expert_intermediate_size") or 0),
        dense_layers=tuple(i for i in range(num_layers) if i in only or (i + 1) % step),
    )


def qwen3_moe_fields(hf: dict) -> dict:
    fields = decoder_fields(hf, "qwen3_moe", sliding=sliding_layers(hf, qwen_window_layers(hf)))
    fields.update(qk_norm=True, moe=moe_fields(hf))
    return fields


def qwen2_moe_fields(hf: dict) -> dict:
    fields = decoder_fields(hf, "qwen2_moe", sliding=sliding_layers(hf, qwen_window_layers(hf)))
    fields.update(qkv_bias=bool(hf.get("qkv_bias", True)), moe=moe_fields(hf))
    return fields


def qwen3_moe_gguf_config(gguf) -> dict:
    config = gguf_config(gguf, "qwen3_moe")
    get = gguf.arch_field
    config.update(
        num_experts=get("expert_count"),
        num_experts_per_tok=get("expert_used_count"),
        moe_intermediate_size=get("expert_feed_forward_length"),
        norm_topk_prob=bool(get("expert_weights_norm", True)),  # llama.cpp's default
    )
    return config


_EXPERTS = dict(read_parameter=NAMES.read_parameter, direct_name=NAMES.direct_name)
QWEN3_MOE = ModelFamily(
    model_type="qwen3_moe",
    architectures=("Qwen3MoeForCausalLM",),
    config_fields=qwen3_moe_fields,
    logical_axes=EXPERT_AXES + QK_NORM_AXES,
    gguf_architecture="qwen3moe",
    gguf_config=qwen3_moe_gguf_config,
    gguf_expert_names=NAMES.gguf_expert_names,
    **_EXPERTS,
)
QWEN2_MOE = ModelFamily(
    model_type="qwen2_moe",
    architectures=("Qwen2MoeForCausalLM",),
    config_fields=qwen2_moe_fields,
    logical_axes=EXPERT_AXES,
    **_EXPERTS,
)
