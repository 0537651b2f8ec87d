"""``EncoderConfig``: an encoder's ``config.json`` (BERT, RoBERTa, XLM-R, ModernBERT; the
families in ``jaxgen.families.encoders``)."""

from __future__ import annotations

import dataclasses

from jaxgen.families.encoders import encoder_family_of_hf

# Each encoder's activations: transformers' names for BERT's, the gated MLP's for ModernBERT's.
ACTIVATIONS = {
    "bert": ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu"),
    "modernbert": ("gelu", "gelu_tanh", "silu"),
}
CLASSIFIER_POOLING = ("CLS", "MEAN")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EncoderConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int  # 0: no token type embeddings (ModernBERT)
    encoder: str = "bert"  # the model that runs it: "bert" or "modernbert"
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    pad_token_id: int = 0
    # Positions count from ``pad_token_id + 1`` (RoBERTa, XLM-R), else from 0.
    position_offset: int = 0
    # A sequence classifier's labels (0: the base model, no head), and its head's shape:
    # "pooler" (BERT: pooler dense + tanh, then classifier), "dense" (RoBERTa) or "head"
    # (ModernBERT), reading each sequence's ``classifier_pooling`` row(s): CLS or MEAN.
    num_labels: int = 0
    classifier: str = "pooler"
    classifier_pooling: str = "CLS"
    classifier_activation: str = "gelu"  # ModernBERT's head
    classifier_bias: bool = True  # ModernBERT's ``head.dense``
    checkpoint_prefix: str = ""  # the base model's tensors' prefix ("bert.", "roberta.")
    has_pooler: bool = False  # the checkpoint holds ``pooler.dense`` (BERT's [CLS] pooler)
    # Rotary encoders (ModernBERT): the RoPE bases of the global and the local layers, each
    # layer's "full_attention" or "sliding_attention", and the local window: a sliding layer's
    # row sees the rows within ``local_attention // 2`` of it.
    rope_theta: float | None = None
    local_rope_theta: float | None = None
    layer_types: tuple[str, ...] = ()
    local_attention: int = 0
    norm_bias: bool = True  # the LayerNorms have a bias
    attention_bias: bool = True  # the q/k/v and output projections have a bias
    mlp_bias: bool = True
    # Not used by the encoder; the engine reads them as it does a decoder's config.
    eos_token_ids: tuple[int, ...] = ()
    is_matryoshka: bool = False
    tie_word_embeddings: bool = False

    def __post_init__(self):
        allowed = ACTIVATIONS[self.encoder]
        for name in ("hidden_act", "classifier_activation"):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                f"{self.num_heads}"
            )
        if self.classifier_pooling not in CLASSIFIER_POOLING:
            raise ValueError(
                f"classifier_pooling must be one of {CLASSIFIER_POOLING}, "
                f"got {self.classifier_pooling!r}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def max_sequence_len(self) -> int:
        """The longest input its position table (or its rotary context) holds."""
        return self.max_position_embeddings - self.position_offset

    @classmethod
    def from_hf_dict(cls, hf: dict, *, has_pooler: bool = False) -> EncoderConfig:
        found = encoder_family_of_hf(hf)
        if found is None:
            raise ValueError(f"not an encoder this package runs: {hf.get('architectures')}")
        family, classifies = found
        pad = hf.get("pad_token_id")
        pad = 0 if pad is None else pad
        labels = (
            hf.get("num_labels") or len(hf.get("id2label") or {}) or 2
        )  # transformers writes id2label
        return cls(
            model_type=family.model_type,
            encoder=family.encoder,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=hf["num_attention_heads"],
            intermediate_size=hf["intermediate_size"],
            max_position_embeddings=hf["max_position_embeddings"],
            pad_token_id=pad,
            position_offset=pad + 1 if family.offset_positions else 0,
            num_labels=labels if classifies else 0,
            classifier=family.classifier,
            checkpoint_prefix=family.prefix if classifies else "",
            has_pooler=has_pooler,
            is_matryoshka=bool(hf.get("is_matryoshka") or hf.get("matryoshka_dimensions")),
            **family.config_fields(hf),
        )
