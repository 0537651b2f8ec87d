"""Qwen3: RMSNorms over each head's queries and keys; sliding layers from
``max_window_layers`` on when ``use_sliding_window`` is set."""

from __future__ import annotations

from jaxgen.families.family import ModelFamily
from jaxgen.families.hf_fields import decoder_fields, qwen_window_layers, sliding_layers

QK_NORM_AXES = ((r"layers\.\d+\.self_attn\.[qk]_norm\.weight", (None,)),)  # per head_dim


def config_fields(hf: dict) -> dict:
    sliding = sliding_layers(hf, qwen_window_layers(hf))
    return {**decoder_fields(hf, "qwen3", sliding=sliding), "qk_norm": True}


FAMILY = ModelFamily(
    model_type="qwen3",
    architectures=("Qwen3ForCausalLM",),
    config_fields=config_fields,
    logical_axes=QK_NORM_AXES,
    gguf_architecture="qwen3",
)
