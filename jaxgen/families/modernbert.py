"""ModernBERT (transformers' ``ModernBertModel`` and ``ModernBertForSequenceClassification``):
what its ``config.json`` says that a BERT's does not.

Pre-norm blocks whose LayerNorms may have no bias (``norm_bias``), rotary positions with one
base on the global layers (``global_rope_theta``) and another on the local ones
(``local_rope_theta``), every ``global_attn_every_n_layers``-th layer global (layer 0 first)
and the others attending within ``local_attention // 2`` rows on each side, a GeGLU MLP, and
no token types. transformers 5 writes the layers and bases as ``layer_types`` and
``rope_parameters`` (``full_attention`` / ``sliding_attention``); both spellings read.
"""

from __future__ import annotations

DEFAULT_GLOBAL_THETA = 160_000.0
DEFAULT_LOCAL_THETA = 10_000.0
LAYER_TYPES = ("full_attention", "sliding_attention")
# transformers' activation names -> the gated MLP's (``jaxgen.models.mlp.ACTIVATIONS``).
ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "silu": "silu",
    "swish": "silu",
}
CLASSIFIER_POOLING = {"cls": "CLS", "mean": "MEAN"}


def modernbert_fields(hf: dict) -> dict:
    """The ``EncoderConfig`` fields a ModernBERT ``config.json`` spells its own way."""
    global_theta, local_theta = rope_thetas(hf)
    pooling = hf.get("classifier_pooling", "cls")
    if pooling not in CLASSIFIER_POOLING:
        raise ValueError(f"classifier_pooling must be 'cls' or 'mean', got {pooling!r}")
    return {
        "type_vocab_size": 0,
        "layer_norm_eps": hf.get("norm_eps", 1e-5),
        "hidden_act": activation(hf, "hidden_activation"),
        "rope_theta": global_theta,
        "local_rope_theta": local_theta,
        "local_attention": hf.get("local_attention", 128),
        "layer_types": layer_types(hf),
        "norm_bias": bool(hf.get("norm_bias", False)),
        "attention_bias": bool(hf.get("attention_bias", False)),
        "mlp_bias": bool(hf.get("mlp_bias", False)),
        "classifier_pooling": CLASSIFIER_POOLING[pooling],
        "classifier_activation": activation(hf, "classifier_activation"),
        "classifier_bias": bool(hf.get("classifier_bias", False)),
    }


def activation(hf: dict, key: str) -> str:
    """The gated MLP's name for the activation ``hf[key]`` (default "gelu")."""
    name = hf.get(key) or "gelu"
    if name not in ACTIVATIONS:
        raise ValueError(f"{key} must be one of {tuple(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]


def layer_types(hf: dict) -> tuple[str, ...]:
    """Each layer's "full_attention" or "sliding_attention": ``layer_types`` as written, or
    every ``global_attn_every_n_layers``-th layer (from 0) full and the others sliding."""
    num_layers = hf["num_hidden_layers"]
    types = hf.get("layer_types")
    if types is None:
        every = hf.get("global_attn_every_n_layers", 3)
        types = [LAYER_TYPES[bool(i % every)] for i in range(num_layers)]
    types = tuple(types)
    if len(types) != num_layers or any(t not in LAYER_TYPES for t in types):
        raise ValueError(
            f"layer_types must name {LAYER_TYPES} for each of the {num_layers} layers, got {types}"
        )
    return types


def rope_thetas(hf: dict) -> tuple[float, float]:
    """The RoPE bases of the global and of the local layers; scaled RoPE is refused."""
    params = hf.get("rope_parameters") or {}
    full = params.get("full_attention") or {}
    sliding = params.get("sliding_attention") or {}
    for kind in (full, sliding, hf.get("rope_scaling") or {}):
        rope_type = kind.get("rope_type", kind.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"rope_type {rope_type!r}: ModernBERT loads with default RoPE only")
    global_theta = full.get("rope_theta") or hf.get("global_rope_theta") or DEFAULT_GLOBAL_THETA
    local_theta = sliding.get("rope_theta")
    if local_theta is None:
        # transformers 4 rotates local layers with the global base when this is null.
        local_theta = hf.get("local_rope_theta", DEFAULT_LOCAL_THETA) or global_theta
    return float(global_theta), float(local_theta)
