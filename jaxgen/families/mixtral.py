"""Mixtral: Llama with a sliding window over every layer and a top-2 of 8 experts
(``block_sparse_moe``, experts ``w1``/``w3``/``w2``). llama.cpp writes it as a ``llama`` GGUF
with experts."""

from __future__ import annotations

from jaxgen.families.experts import EXPERT_AXES, ExpertNames
from jaxgen.families.family import ModelFamily
from jaxgen.families.gguf_names import gguf_tensor_name, unpermute_rotary
from jaxgen.families.hf_fields import decoder_fields, sliding_layers
from jaxgen.families.llama import llama_gguf_config

NAMES = ExpertNames("block_sparse_moe", ("w1", "w3", "w2"))


def config_fields(hf: dict) -> dict:
    fields = decoder_fields(hf, "mixtral", sliding=sliding_layers(hf))
    fields["moe"] = dict(
        num_experts=hf.get("num_local_experts", 8),
        num_experts_per_token=hf.get("num_experts_per_tok", 2),
        expert_size=hf["intermediate_size"],
        norm_topk_prob=True,
    )
    return fields


def has_experts(gguf) -> bool:
    return bool(gguf.arch_field("expert_count"))


def mixtral_gguf_config(gguf) -> dict:
    config = llama_gguf_config(gguf)
    config.update(
        model_type="mixtral",
        num_local_experts=gguf.arch_field("expert_count"),
        num_experts_per_tok=gguf.arch_field("expert_used_count"),
    )
    return config


def mixtral_gguf_name(name: str, gguf_names: set[str]) -> str:
    if name.endswith("ffn_gate_inp.weight"):  # the router
        return f"model.layers.{name.split('.')[1]}.block_sparse_moe.gate.weight"
    return gguf_tensor_name(name, gguf_names)


FAMILY = ModelFamily(
    model_type="mixtral",
    architectures=("MixtralForCausalLM",),
    config_fields=config_fields,
    read_parameter=NAMES.read_parameter,
    direct_name=NAMES.direct_name,
    logical_axes=EXPERT_AXES,
    gguf_architecture="llama",
    gguf_accepts=has_experts,
    gguf_config=mixtral_gguf_config,
    gguf_tensor_name=mixtral_gguf_name,
    gguf_expert_names=NAMES.gguf_expert_names,
    gguf_rows=unpermute_rotary,
)
