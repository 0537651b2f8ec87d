"""Gemma 2 and Gemma 3 (text): Gemma's blocks (four norms, ``(1 + weight)`` RMSNorms, scaled
embeddings), the query scale ``query_pre_attn_scalar ** -0.5``, sliding layers every
2nd (Gemma 2) or all but every 6th (Gemma 3), Gemma 2's soft caps, Gemma 3's q/k norms and
local RoPE base; float16 overflows. Its GGUF stores every norm weight plus one, names the
feed-forward norms its own way, and has no ``query_pre_attn_scalar`` (llama.cpp's rule)."""

from __future__ import annotations

import functools

from jaxgen.families.family import ModelFamily
from jaxgen.families.gguf_names import gguf_config, gguf_tensor_name
from jaxgen.families.hf_fields import (
    decoder_fields,
    every_nth_full,
    rope_parameters,
    sliding_layers,
)
from jaxgen.families.qwen3 import QK_NORM_AXES

FEED_FORWARD_NORM_AXES = ((r"layers\.\d+\.(pre|post)_feedforward_layernorm\.weight", ("embed",)),)
GGUF_LAYER_NAMES = {  # they replace the Llama meaning of ffn_norm
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# Gemma 2/3 27B: llama.cpp scales queries by hidden / heads instead of head_dim (its model-size
# rule, since GGUF has no query_pre_attn_scalar); keyed by architecture: block count.
GGUF_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def gemma_fields(hf: dict, model_type: str, sliding, rope: dict) -> dict:
    """The fields both share, over the family's sliding layers and RoPE parameters."""
    fields = decoder_fields(hf, model_type, sliding=sliding, rope=rope, eps=1e-6, tie=True)
    head_dim = fields["head_dim"]
    fields.update(
        attention_scale=float(hf.get("query_pre_attn_scalar") or head_dim) ** -0.5,
        attn_logit_softcap=hf.get("attn_logit_softcapping"),
        final_logit_softcap=hf.get("final_logit_softcapping"),
    )
    return fields


def gemma2_fields(hf: dict) -> dict:
    return gemma_fields(hf, "gemma2", sliding_layers(hf, every_nth_full(2)), rope_parameters(hf))


def gemma3_fields(hf: dict) -> dict:
    """Gemma 3's local RoPE base: transformers 5's ``rope_parameters`` per layer type, or
    ``rope_local_base_freq``."""
    params = dict(hf.get("rope_parameters") or {})
    if "full_attention" in params:
        local = params.get("sliding_attention") or {}
        if local.get("rope_type", "default") != "default":
            raise ValueError(
                "rope_parameters['sliding_attention']: only the default RoPE is supported "
                f"on sliding layers, got {local.get('rope_type')!r}"
            )
        local_theta = float(local.get("rope_theta", 10000.0))
        params = dict(params["full_attention"])
    else:
        local_theta = float(hf.get("rope_local_base_freq", 10000.0))
    params.update(hf.get("rope_scaling") or {})
    pattern = hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern") or 6
    sliding = sliding_layers(hf, every_nth_full(pattern))
    fields = gemma_fields(hf, "gemma3_text", sliding, params)
    fields.update(qk_norm=True, local_rope_theta=local_theta)
    return fields


def gemma_gguf_config(gguf, model_type: str) -> dict:
    """The common fields, and the soft caps, sliding layers, query scale, local RoPE base."""
    config = gguf_config(gguf, model_type)
    arch, get = gguf.architecture, gguf.arch_field
    layers = config["num_hidden_layers"]
    pattern = get("attention.sliding_window_pattern", 2 if arch == "gemma2" else 6)
    if isinstance(pattern, int):
        sliding = [bool((i + 1) % pattern) for i in range(layers)]
    else:
        sliding = [bool(x) for x in pattern]
    scalar = config["head_dim"]
    if layers == GGUF_27B_LAYERS[arch]:
        scalar = config["hidden_size"] // config["num_attention_heads"]
    config.update(
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=scalar,
        layer_types=["sliding_attention" if s else "full_attention" for s in sliding],
        rms_norm_eps=get("attention.layer_norm_rms_epsilon", 1e-6),
    )
    if arch == "gemma2":
        config["attn_logit_softcapping"] = get("attn_logit_softcapping")
        config["final_logit_softcapping"] = get("final_logit_softcapping")
    else:
        config["rope_local_base_freq"] = 10000.0  # llama.cpp's fixed base of local layers
    return config


def gemma_gguf_name(name: str, gguf_names: set[str]) -> str:
    return gguf_tensor_name(name, gguf_names, GGUF_LAYER_NAMES)


_GEMMA = dict(
    blocks="gemma",
    float16_stable=False,
    gguf_tensor_name=gemma_gguf_name,
    gguf_norm_offset=1.0,
)
GEMMA2 = ModelFamily(
    model_type="gemma2",
    architectures=("Gemma2ForCausalLM",),
    config_fields=gemma2_fields,
    logical_axes=FEED_FORWARD_NORM_AXES,
    gguf_architecture="gemma2",
    gguf_config=functools.partial(gemma_gguf_config, model_type="gemma2"),
    **_GEMMA,
)
GEMMA3 = ModelFamily(
    model_type="gemma3_text",
    architectures=("Gemma3ForCausalLM",),
    config_fields=gemma3_fields,
    logical_axes=FEED_FORWARD_NORM_AXES + QK_NORM_AXES,
    gguf_architecture="gemma3",
    gguf_config=functools.partial(gemma_gguf_config, model_type="gemma3_text"),
    **_GEMMA,
)
