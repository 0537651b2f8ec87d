"""Qwen2: biases on Q, K and V (never on the output projection); a sliding window only with
``use_sliding_window``."""

from __future__ import annotations

from jaxgen.families.family import ModelFamily
from jaxgen.families.hf_fields import decoder_fields


def config_fields(hf: dict) -> dict:
    window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
    fields = decoder_fields(hf, "qwen2", sliding=(window, ()))
    fields.update(qkv_bias=True, o_bias=False)
    return fields


FAMILY = ModelFamily(
    model_type="qwen2",
    architectures=("Qwen2ForCausalLM",),
    config_fields=config_fields,
    gguf_architecture="qwen2",
)
