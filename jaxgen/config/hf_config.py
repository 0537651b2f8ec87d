"""A Hugging Face ``config.json`` read into ``ModelConfig`` fields: each family's field names,
defaults and quirks (Qwen2's Q/K/V bias, Gemma's query scale and sliding pattern, Phi-3's
LongRoPE, Falcon's fused attention), and the architectures that load.

The fields come as ``ModelConfig.from_dict`` takes them (``RopeScaling`` and ``MoEConfig`` as
dictionaries); ``ModelConfig.from_hf_dict`` builds the config.
"""

from __future__ import annotations

import math
from typing import Any

# HF architecture name -> our family (model_type).
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "Phi3ForCausalLM": "phi3",
    "MixtralForCausalLM": "mixtral",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "FalconForCausalLM": "falcon",
}
SUPPORTED_MODEL_TYPES = set(SUPPORTED_ARCHITECTURES.values())
ROPE_TYPES = ("default", "linear", "llama3", "longrope")
ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_tanh": "gelu_tanh",
    "gelu": "gelu",
}


def model_config_fields(hf: dict[str, Any]) -> dict[str, Any]:
    """The ``ModelConfig`` fields of a Hugging Face ``config.json`` dictionary."""
    model_type = _family(hf)
    if model_type == "falcon":
        return _falcon_fields(hf)
    num_heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // num_heads
    num_layers = hf["num_hidden_layers"]
    rope, local_rope_theta = _rope_parameters(hf, model_type)
    rope_theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
    partial = float(rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)))
    if partial != 1.0:
        raise ValueError(
            f"partial_rotary_factor={partial} is not supported (RoPE over the whole head only)"
        )
    rope_scaling = _rope_scaling(rope, hf, head_dim)
    attention_bias = bool(hf.get("attention_bias", False))
    sliding_window, layer_types = _sliding_layers(hf, model_type, num_layers)
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "silu"
    if act not in ACTIVATIONS:
        raise ValueError(f"unsupported hidden_act {act!r}; supported: {sorted(ACTIVATIONS)}")
    gemma = model_type in ("gemma2", "gemma3_text")
    scale = None
    if gemma:
        scale = float(hf.get("query_pre_attn_scalar") or head_dim) ** -0.5
    return dict(
        model_type=model_type,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        head_dim=head_dim,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6 if gemma else 1e-5)),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", gemma)),
        qkv_bias=_qkv_bias(hf, model_type, attention_bias),
        o_bias=False if model_type == "qwen2" else attention_bias,
        mlp_bias=bool(hf.get("mlp_bias", False)),
        hidden_act=ACTIVATIONS[act],
        sliding_window=sliding_window,
        layer_types=layer_types,
        qk_norm=model_type in ("qwen3", "qwen3_moe", "gemma3_text"),
        attention_scale=scale,
        attn_logit_softcap=hf.get("attn_logit_softcapping") if gemma else None,
        final_logit_softcap=hf.get("final_logit_softcapping") if gemma else None,
        local_rope_theta=local_rope_theta,
        moe=_moe_config(hf, model_type, num_layers),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=_eos_ids(hf),
    )


def _family(hf: dict) -> str:
    model_type = hf.get("model_type")
    if model_type in SUPPORTED_MODEL_TYPES:
        return model_type
    archs = hf.get("architectures") or []
    known = [a for a in archs if a in SUPPORTED_ARCHITECTURES]
    if not known:
        name = archs[0] if archs else model_type
        raise ValueError(
            f"unsupported architecture {name!r}; supported: "
            f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
        )
    return SUPPORTED_ARCHITECTURES[known[0]]


def _qkv_bias(hf: dict, model_type: str, attention_bias: bool) -> bool:
    if model_type == "qwen2":
        return True
    if model_type == "qwen2_moe":
        return bool(hf.get("qkv_bias", True))
    return attention_bias


def _eos_ids(hf: dict) -> tuple[int, ...]:
    eos = hf.get("eos_token_id")
    return tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))


def _rope_parameters(hf: dict, model_type: str) -> tuple[dict, float | None]:
    """The global RoPE parameters, and Gemma 3's local (sliding-layer) base."""
    params = dict(hf.get("rope_parameters") or {})
    local_theta = None
    if model_type == "gemma3_text":
        if "full_attention" in params:  # transformers 5: one dict per layer type
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
    scaling = hf.get("rope_scaling") or {}
    if scaling:
        params.update(scaling)
    return params, local_theta


def _rope_scaling(rope: dict, hf: dict, head_dim: int) -> dict[str, Any]:
    """``RopeScaling``'s fields."""
    rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
    if rope_type in ("su", "yarn") and hf.get("model_type") == "phi3":
        rope_type = "longrope"  # Phi-3's old names for the same scaling
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"unsupported rope_scaling type {rope_type!r}; supported: {', '.join(ROPE_TYPES)}"
        )
    original = int(
        rope.get("original_max_position_embeddings")
        or hf.get("original_max_position_embeddings")
        or 8192
    )
    short_factor = tuple(float(x) for x in rope.get("short_factor") or ())
    long_factor = tuple(float(x) for x in rope.get("long_factor") or ())
    attention_factor = 1.0
    if rope_type == "longrope":
        for name, factors in (("short_factor", short_factor), ("long_factor", long_factor)):
            if len(factors) != head_dim // 2:
                raise ValueError(
                    f"rope_scaling.{name} has {len(factors)} entries, expected {head_dim // 2}"
                )
        factor = rope.get("factor") or hf.get("max_position_embeddings", original) / original
        attention_factor = rope.get("attention_factor")
        if attention_factor is None:
            attention_factor = (
                1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
            )
    return dict(
        rope_type=rope_type,
        factor=float(rope.get("factor") or 1.0),
        low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
        high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=original,
        short_factor=short_factor,
        long_factor=long_factor,
        attention_factor=float(attention_factor),
    )


def _sliding_layers(hf: dict, model_type: str, num_layers: int):
    """``(sliding_window, layer_types)`` as the family's transformers model applies them."""
    window = hf.get("sliding_window")
    if model_type == "mistral":
        return window, ()
    if model_type == "qwen2":
        return (window if hf.get("use_sliding_window") else None), ()
    if model_type in (
        "qwen3",
        "qwen3_moe",
        "qwen2_moe",
        "gemma2",
        "gemma3_text",
        "mixtral",
        "phi3",
    ):
        if not window:
            return None, ()
        types = hf.get("layer_types")
        if types is None:
            if model_type in ("mixtral", "phi3"):  # every layer slides
                return window, ()
            if model_type == "gemma2":
                types = [
                    "sliding_attention" if (i + 1) % 2 else "full_attention"
                    for i in range(num_layers)
                ]
            elif model_type == "gemma3_text":
                pattern = hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern") or 6
                types = [
                    "sliding_attention" if (i + 1) % pattern else "full_attention"
                    for i in range(num_layers)
                ]
            else:
                start = hf.get("max_window_layers", num_layers)
                use = hf.get("use_sliding_window", False)
                types = [
                    "sliding_attention" if use and i >= start else "full_attention"
                    for i in range(num_layers)
                ]
        types = tuple(types)
        if "sliding_attention" not in types:
            return None, ()
        return window, types
    return None, ()


def _moe_config(hf: dict, model_type: str, num_layers: int) -> dict[str, Any] | None:
    """``MoEConfig``'s fields (None: a dense MLP)."""
    if model_type == "mixtral":
        return dict(
            num_experts=hf.get("num_local_experts", 8),
            num_experts_per_token=hf.get("num_experts_per_tok", 2),
            expert_size=hf["intermediate_size"],
            norm_topk_prob=True,
        )
    if model_type in ("qwen3_moe", "qwen2_moe"):
        step = hf.get("decoder_sparse_step", 1) or 1
        only = set(hf.get("mlp_only_layers") or ())
        dense = tuple(i for i in range(num_layers) if i in only or (i + 1) % step)
        return dict(
            num_experts=hf.get("num_local_experts") or hf.get("num_experts"),
            num_experts_per_token=hf.get("num_experts_per_tok", 8),
            expert_size=hf["moe_intermediate_size"],
            norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
            shared_expert_size=int(hf.get("shared_expert_intermediate_size") or 0),
            dense_layers=dense,
        )
    return None


def _falcon_fields(hf: dict) -> dict[str, Any]:
    """Falcon: fused QKV (MHA, multi-query, or the grouped "new decoder architecture"),
    LayerNorms with bias, GELU MLP, attention and MLP in parallel."""
    if hf.get("alibi"):
        raise ValueError(
            "Falcon with alibi=True is not supported (ALiBi position biases); only RoPE Falcon "
            "checkpoints (alibi=false) load"
        )
    new_arch = bool(hf.get("new_decoder_architecture", False))
    parallel = bool(hf.get("parallel_attn", True))
    if new_arch and not parallel:
        raise ValueError(
            "Falcon new_decoder_architecture with parallel_attn=False is not supported"
        )
    num_heads = hf.get("num_attention_heads") or hf.get("n_head")
    hidden = hf["hidden_size"]
    if new_arch:
        num_kv_heads = hf.get("num_kv_heads") or num_heads
    elif hf.get("multi_query", True):
        num_kv_heads = 1
    else:
        num_kv_heads = num_heads
    num_layers = hf.get("num_hidden_layers") or hf.get("n_layer")
    rope = dict(hf.get("rope_parameters") or {})
    rope.update(hf.get("rope_scaling") or {})
    norms = hf.get("num_ln_in_parallel_attn")
    if norms is None:
        norms = 2 if new_arch else 1
    act = hf.get("activation", "gelu")
    if act != "gelu":
        raise ValueError(f"Falcon activation {act!r} is not supported; supported: gelu")
    bias = bool(hf.get("bias", False))
    return dict(
        model_type="falcon",
        vocab_size=hf["vocab_size"],
        hidden_size=hidden,
        intermediate_size=hf.get("ffn_hidden_size") or 4 * hidden,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=hidden // num_heads,
        rms_norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        rope_scaling=_rope_scaling(rope, hf, hidden // num_heads),
        max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=bias,
        hidden_act="gelu",
        parallel_attention=parallel,
        num_parallel_norms=int(norms) if (parallel and new_arch) else 1,
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=_eos_ids(hf),
    )
