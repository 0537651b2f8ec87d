"""What every family's ``config.json`` shares, read into ``ModelConfig`` fields: the Llama
field names and defaults, RoPE scaling, sliding layers, end-of-sequence ids. A family's module
calls :func:`decoder_fields` and changes what its transformers model changes."""

from __future__ import annotations

import math
from typing import Any

ROPE_TYPES = ("default", "linear", "llama3", "longrope")
ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_tanh": "gelu_tanh",
    "gelu": "gelu",
}


def decoder_fields(
    hf: dict[str, Any],
    model_type: str,
    *,
    sliding: tuple[int | None, tuple[str, ...]] = (None, ()),
    rope: dict | None = None,
    rope_aliases: dict[str, str] | None = None,
    eps: float = 1e-5,
    tie: bool = False,
) -> dict[str, Any]:
    """The ``ModelConfig`` fields of a Llama-shaped ``config.json``. ``sliding``:
    ``(sliding_window, layer_types)`` as the family applies them (:func:`sliding_layers`);
    ``rope``: the global RoPE parameters when the family keeps them elsewhere
    (default :func:`rope_parameters`); ``rope_aliases``: the family's old names of a RoPE
    type; ``eps`` and ``tie``: its defaults of ``rms_norm_eps`` and ``tie_word_embeddings``."""
    num_heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // num_heads
    rope = rope_parameters(hf) if rope is None else rope
    partial = float(rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)))
    if partial != 1.0:
        raise ValueError(
            f"partial_rotary_factor={partial} is not supported (RoPE over the whole head only)"
        )
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "silu"
    if act not in ACTIVATIONS:
        raise ValueError(f"unsupported hidden_act {act!r}; supported: {sorted(ACTIVATIONS)}")
    attention_bias = bool(hf.get("attention_bias", False))
    return dict(
        model_type=model_type,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        head_dim=head_dim,
        rms_norm_eps=float(hf.get("rms_norm_eps", eps)),
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        rope_scaling=rope_scaling(rope, hf, head_dim, rope_aliases),
        max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", tie)),
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        mlp_bias=bool(hf.get("mlp_bias", False)),
        hidden_act=ACTIVATIONS[act],
        sliding_window=sliding[0],
        layer_types=sliding[1],
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=eos_ids(hf),
    )


def eos_ids(hf: dict) -> tuple[int, ...]:
    eos = hf.get("eos_token_id")
    return tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))


def rope_parameters(hf: dict) -> dict:
    """The RoPE parameters: transformers 5's ``rope_parameters`` updated by ``rope_scaling``."""
    params = dict(hf.get("rope_parameters") or {})
    params.update(hf.get("rope_scaling") or {})
    return params


def rope_scaling(
    rope: dict, hf: dict, head_dim: int, aliases: dict[str, str] | None = None
) -> dict[str, Any]:
    """``RopeScaling``'s fields."""
    rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
    rope_type = (aliases or {}).get(rope_type, rope_type)
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


def sliding_layers(hf: dict, default_types=None) -> tuple[int | None, tuple[str, ...]]:
    """``(sliding_window, layer_types)`` of a family that marks its sliding layers in
    ``layer_types``; without one, ``default_types(num_layers)`` gives them (None: every layer
    slides). No window, or no sliding layer: ``(None, ())``."""
    window = hf.get("sliding_window")
    if not window:
        return None, ()
    types = hf.get("layer_types")
    if types is None:
        if default_types is None:
            return window, ()
        types = default_types(hf["num_hidden_layers"])
    types = tuple(types)
    if "sliding_attention" not in types:
        return None, ()
    return window, types


def every_nth_full(pattern: int):
    """``default_types`` for :func:`sliding_layers`: every ``pattern``-th layer full, the
    rest sliding (Gemma 2's 2, Gemma 3's 6)."""
    return lambda num_layers: [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)
    ]


def qwen_window_layers(hf: dict):
    """``default_types`` of the Qwen families: layers from ``max_window_layers`` on slide when
    ``use_sliding_window`` is set."""
    start = hf.get("max_window_layers", hf["num_hidden_layers"])
    use = hf.get("use_sliding_window", False)
    return lambda num_layers: [
        "sliding_attention" if use and i >= start else "full_attention" for i in range(num_layers)
    ]
