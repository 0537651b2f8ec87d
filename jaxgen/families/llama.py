"""Llama: the names every other family is read against (the defaults of ``ModelFamily``);
its GGUF permutes Q and K rows for interleaved rotary pairs, and a Q bias means
``attention_bias``."""

from __future__ import annotations

from jaxgen.families.family import ModelFamily
from jaxgen.families.gguf_names import gguf_config, unpermute_rotary
from jaxgen.families.hf_fields import decoder_fields


def config_fields(hf: dict) -> dict:
    return decoder_fields(hf, "llama")


def llama_gguf_config(gguf) -> dict:
    config = gguf_config(gguf, "llama")
    if any(name.endswith("q_proj.bias") for name in gguf.tensors):
        config["attention_bias"] = True
    return config


def dense(gguf) -> bool:
    """A ``llama`` GGUF without experts (with them it is Mixtral)."""
    return not gguf.arch_field("expert_count")


FAMILY = ModelFamily(
    model_type="llama",
    architectures=("LlamaForCausalLM",),
    config_fields=config_fields,
    gguf_architecture="llama",
    gguf_accepts=dense,
    gguf_config=llama_gguf_config,
    gguf_rows=unpermute_rotary,
)
