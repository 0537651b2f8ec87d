"""Model configuration: a frozen, keyword-only dataclass built from a Hugging Face ``config.json``.

One ``ModelConfig`` describes every supported family. The fields every decoder has come first;
then a few typed fields that only some families set (each says which), and two nested configs
for the parts that come as a group: ``RopeScaling`` (frequency scaling) and ``MoEConfig``
(mixture-of-experts MLP). What differs in a block's *structure* (Gemma's four norms, Falcon's
parallel attention and MLP) is not a flag: ``model_type`` picks the family's decoder layer
(``jaxgen.models.causal_lm``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
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
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RopeScaling:
    """RoPE frequency scaling: ``"default"`` (none), ``"linear"``, ``"llama3"`` or ``"longrope"``
    (Phi-3: ``short_factor`` for sequences up to ``original_max_position_embeddings`` tokens,
    ``long_factor`` beyond, cos/sin scaled by ``attention_factor``)."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoEConfig:
    """A sparse MLP: a softmax router picks ``num_experts_per_token`` of ``num_experts`` SwiGLU
    experts per token (Mixtral, Qwen3-MoE, Qwen2-MoE). ``norm_topk_prob``: renormalise the chosen
    probabilities to sum to 1 (always for Mixtral). ``shared_expert_size``: width of an expert
    every token also runs, gated by a sigmoid (0: none). ``dense_layers``: layers that keep a
    dense MLP of ``intermediate_size`` (Qwen3-MoE's ``mlp_only_layers``/``decoder_sparse_step``)."""

    num_experts: int
    num_experts_per_token: int
    expert_size: int
    norm_topk_prob: bool = True
    shared_expert_size: int = 0
    dense_layers: tuple[int, ...] = ()

    def __post_init__(self):
        if not 1 <= self.num_experts_per_token <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok ({self.num_experts_per_token}) must be between 1 and "
                f"the number of experts ({self.num_experts})"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Architecture of a decoder-only transformer of one of the supported families."""

    model_type: str = "llama"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5  # the epsilon of every norm (LayerNorm's for Falcon)
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"  # "silu" (SwiGLU), "gelu_tanh" (Gemma's GeGLU), "gelu" (Falcon)
    sliding_window: int | None = None
    # Per layer "full_attention" or "sliding_attention" (Qwen3, Gemma 2/3); () means every layer
    # is sliding when ``sliding_window`` is set (Mistral, Qwen2), else full.
    layer_types: tuple[str, ...] = ()
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm over each head's q and k before RoPE
    attention_scale: float | None = None  # None: head_dim ** -0.5 (Gemma: query_pre_attn_scalar)
    attn_logit_softcap: float | None = None  # Gemma 2: cap * tanh(scores / cap)
    final_logit_softcap: float | None = None  # Gemma 2: the same on the LM head's logits
    local_rope_theta: float | None = None  # Gemma 3: RoPE base of sliding layers (unscaled)
    moe: MoEConfig | None = None  # Mixtral, Qwen3-MoE, Qwen2-MoE
    # Falcon: attention and MLP read the same input, their outputs added to the residual
    # (``parallel_attn``); from one LayerNorm or two (``num_ln_in_parallel_attn``).
    parallel_attention: bool = False
    num_parallel_norms: int = 1
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise ValueError(
                f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers"
            )
        bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if bad:
            raise ValueError(f"layer_types: unsupported {bad}; supported: {LAYER_TYPES}")
        if "sliding_attention" in self.layer_types and not self.sliding_window:
            raise ValueError("layer_types has sliding layers but sliding_window is not set")
        if self.hidden_act not in ("silu", "gelu_tanh", "gelu"):
            raise ValueError(f"hidden_act must be silu, gelu_tanh or gelu, got {self.hidden_act!r}")

    def layer_sliding_window(self, layer: int) -> int | None:
        """The sliding window of ``layer`` (None: it attends to every earlier token)."""
        if self.layer_types:
            return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None
        return self.sliding_window

    @property
    def every_layer_sliding_window(self) -> int | None:
        """The window when every layer slides (Mistral), else None (some layer is global)."""
        windows = {self.layer_sliding_window(i) for i in range(self.num_layers)}
        return self.sliding_window if windows == {self.sliding_window} else None

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer not in self.moe.dense_layers

    @property
    def num_params(self) -> int:
        """Number of parameters (embedding counted once when tied; all experts counted)."""
        return self._count_params(active=False)

    @property
    def num_active_params(self) -> int:
        """Parameters one token's decode step reads: the experts it is routed to, not all of
        them, and the LM head but not an untied embedding table (only the token's row)."""
        return self._count_params(active=True)

    def _count_params(self, *, active: bool) -> int:
        d, f, hd = self.hidden_size, self.intermediate_size, self.head_dim
        attn = d * hd * (self.num_heads * 2 + self.num_kv_heads * 2)
        gates = 2 if self.model_type == "falcon" else 3
        total = 0
        for layer in range(self.num_layers):
            if self.is_moe_layer(layer):
                moe = self.moe
                experts = moe.num_experts_per_token if active else moe.num_experts
                mlp = experts * 3 * d * moe.expert_size + moe.num_experts * d  # + router
                mlp += 3 * d * moe.shared_expert_size + (d if moe.shared_expert_size else 0)
            else:
                mlp = gates * d * f
            total += attn + mlp + 2 * d
        tables = 1 if self.tie_word_embeddings or active else 2
        return total + self.vocab_size * d * tables + d

    def kv_bytes_per_token(self, itemsize: int) -> int:
        """Bytes of K and V cached per token over all layers (what the page pool allocates)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * itemsize

    def kv_bytes_per_sequence(self, length: int, itemsize: int) -> int:
        """Bytes of K and V a sequence of ``length`` tokens needs, a sliding-window layer
        holding at most its window."""
        per_layer_token = 2 * self.num_kv_heads * self.head_dim * itemsize
        return sum(
            per_layer_token * min(length, self.layer_sliding_window(layer) or length)
            for layer in range(self.num_layers)
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Inverse of ``dataclasses.asdict`` (after a JSON round trip: lists back to tuples,
        nested dictionaries back to ``RopeScaling`` / ``MoEConfig``)."""
        data = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        rope = {
            k: tuple(v) if isinstance(v, list) else v
            for k, v in (data.get("rope_scaling") or {}).items()
        }
        data["rope_scaling"] = RopeScaling(**rope)
        if data.get("moe") is not None:
            moe = {k: tuple(v) if isinstance(v, list) else v for k, v in data["moe"].items()}
            data["moe"] = MoEConfig(**moe)
        return cls(**data)

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any]) -> ModelConfig:
        """Builds a config from a Hugging Face ``config.json`` dictionary."""
        model_type = _family(hf)
        if model_type == "falcon":
            return _falcon_config(hf)
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
        return cls(
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

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> ModelConfig:
        """Reads ``config.json`` and builds the config."""
        with open(path) as f:
            return cls.from_hf_dict(json.load(f))


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


def _rope_scaling(rope: dict, hf: dict, head_dim: int) -> RopeScaling:
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
    return RopeScaling(
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


def _moe_config(hf: dict, model_type: str, num_layers: int) -> MoEConfig | None:
    if model_type == "mixtral":
        return MoEConfig(
            num_experts=hf.get("num_local_experts", 8),
            num_experts_per_token=hf.get("num_experts_per_tok", 2),
            expert_size=hf["intermediate_size"],
            norm_topk_prob=True,
        )
    if model_type in ("qwen3_moe", "qwen2_moe"):
        step = hf.get("decoder_sparse_step", 1) or 1
        only = set(hf.get("mlp_only_layers") or ())
        dense = tuple(i for i in range(num_layers) if i in only or (i + 1) % step)
        return MoEConfig(
            num_experts=hf.get("num_local_experts") or hf.get("num_experts"),
            num_experts_per_token=hf.get("num_experts_per_tok", 8),
            expert_size=hf["moe_intermediate_size"],
            norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
            shared_expert_size=int(hf.get("shared_expert_intermediate_size") or 0),
            dense_layers=dense,
        )
    return None


def _falcon_config(hf: dict) -> ModelConfig:
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
    return ModelConfig(
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
