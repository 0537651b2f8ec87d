"""Mistral: Llama with one sliding window over every layer."""

from __future__ import annotations

from jaxgen.families.family import ModelFamily
from jaxgen.families.hf_fields import decoder_fields


def config_fields(hf: dict) -> dict:
    return decoder_fields(hf, "mistral", sliding=(hf.get("sliding_window"), ()))


FAMILY = ModelFamily(
    model_type="mistral",
    architectures=("MistralForCausalLM",),
    config_fields=config_fields,
    gguf_architecture="mistral",
)
