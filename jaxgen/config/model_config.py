"""Model configuration: a frozen, keyword-only dataclass (each family's module in
``jaxgen.families`` reads one from a Hugging Face ``config.json``).

One ``ModelConfig`` describes every supported family. The fields every decoder has come first;
then a few typed fields that only some families set (each says which), and two nested configs
for the parts that come as a group: ``RopeScaling`` (frequency scaling) and ``MoEConfig``
(mixture-of-experts MLP). What differs in a block's *structure* (Gemma's four norms, Falcon's
parallel attention and MLP) is not a flag: ``model_type`` picks the family's decoder layer
(``jaxgen.families``: the family's ``blocks``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

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
        from jaxgen.families import family_of

        gates = family_of(self.model_type).mlp_projections
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
        """Builds a config from a Hugging Face ``config.json`` dictionary, read by its family's
        ``config_fields`` (``jaxgen.families``)."""
        from jaxgen.families import family_of_hf  # plain Python, imported when first needed

        return cls.from_dict(family_of_hf(hf).config_fields(hf))

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> ModelConfig:
        """Reads ``config.json`` and builds the config."""
        with open(path) as f:
            return cls.from_hf_dict(json.load(f))
