"""``EncoderConfig``: a BERT-shaped encoder's ``config.json`` (BERT, RoBERTa, XLM-R; the
families in ``jaxgen.families.encoders``)."""

from __future__ import annotations

import dataclasses

from jaxgen.families.encoders import encoder_family_of_hf

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EncoderConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    pad_token_id: int = 0
    # Positions count from ``pad_token_id + 1`` (RoBERTa, XLM-R), else from 0.
    position_offset: int = 0
    # A sequence classifier's labels (0: the base model, no head), and its head's shape:
    # "pooler" (BERT: pooler dense + tanh, then classifier) or "dense" (RoBERTa).
    num_labels: int = 0
    classifier: str = "pooler"
    checkpoint_prefix: str = ""  # the base model's tensors' prefix ("bert.", "roberta.")
    has_pooler: bool = False  # the checkpoint holds ``pooler.dense`` (BERT's [CLS] pooler)
    # Not used by the encoder; the engine reads them as it does a decoder's config.
    eos_token_ids: tuple[int, ...] = ()
    is_matryoshka: bool = False
    tie_word_embeddings: bool = False

    def __post_init__(self):
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act must be one of {ACTIVATIONS}, got {self.hidden_act!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                f"{self.num_heads}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def max_sequence_len(self) -> int:
        """The longest input its position table holds."""
        return self.max_position_embeddings - self.position_offset

    @classmethod
    def from_hf_dict(cls, hf: dict, *, has_pooler: bool = False) -> EncoderConfig:
        found = encoder_family_of_hf(hf)
        if found is None:
            raise ValueError(f"not a BERT-family encoder: {hf.get('architectures')}")
        family, classifies = found
        kind = hf.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise ValueError(f"position_embedding_type {kind!r} is not supported (absolute only)")
        pad = hf.get("pad_token_id")
        pad = 0 if pad is None else pad
        labels = (
            hf.get("num_labels") or len(hf.get("id2label") or {}) or 2
        )  # transformers writes id2label
        return cls(
            model_type=family.model_type,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=hf["num_attention_heads"],
            intermediate_size=hf["intermediate_size"],
            max_position_embeddings=hf["max_position_embeddings"],
            type_vocab_size=hf.get("type_vocab_size", 2),
            layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
            hidden_act=hf.get("hidden_act", "gelu"),
            pad_token_id=pad,
            position_offset=pad + 1 if family.offset_positions else 0,
            num_labels=labels if classifies else 0,
            classifier=family.classifier,
            checkpoint_prefix=family.prefix if classifies else "",
            has_pooler=has_pooler,
            is_matryoshka=bool(hf.get("is_matryoshka") or hf.get("matryoshka_dimensions")),
        )
