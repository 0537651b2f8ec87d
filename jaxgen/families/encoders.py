"""Encoder families: the checkpoints that embed and score (never generate).

BERT, RoBERTa and XLM-RoBERTa share one encoder (``jaxgen.models.bert``): post-LayerNorm
blocks, absolute position embeddings, token type embeddings, GELU. What differs is declared
here: RoBERTa and XLM-R number positions from ``pad_token_id + 1`` (fairseq's offset), and
their sequence classifiers are ``classifier.dense`` + ``classifier.out_proj`` on ``<s>`` where
BERT's is its pooler (``pooler.dense``, tanh) then ``classifier``. ModernBERT has an encoder of
its own (``jaxgen.models.modernbert``: pre-norm, rotary, alternating global and sliding-window
layers) and its own ``config.json`` spelling (``jaxgen.families.modernbert``). Plain Python,
beside the decoder families; the decoder registry (``jaxgen.families``) never lists these.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from jaxgen.families.modernbert import modernbert_fields


def bert_fields(hf: dict) -> dict:
    """The ``EncoderConfig`` fields of a BERT-shaped ``config.json`` that other encoders spell
    otherwise (absolute positions only)."""
    kind = hf.get("position_embedding_type", "absolute")
    if kind != "absolute":
        raise ValueError(f"position_embedding_type {kind!r} is not supported (absolute only)")
    return {
        "type_vocab_size": hf.get("type_vocab_size", 2),
        "layer_norm_eps": hf.get("layer_norm_eps", 1e-12),
        "hidden_act": hf.get("hidden_act", "gelu"),
    }


@dataclasses.dataclass(frozen=True)
class EncoderFamily:
    """``prefix``: the base model's tensor prefix in a ``*ForSequenceClassification``
    checkpoint; ``offset_positions``: positions start at ``pad_token_id + 1``;
    ``classifier``: "pooler" (BERT), "dense" (RoBERTa's two-layer head) or "head"
    (ModernBERT's dense, activation, LayerNorm, then classifier); ``encoder``: the model that
    runs it ("bert" or "modernbert"); ``config_fields(hf)``: the config fields it spells its
    own way."""

    model_type: str
    prefix: str
    offset_positions: bool
    classifier: str
    encoder: str = "bert"
    config_fields: Callable[[dict], dict] = bert_fields


BERT = EncoderFamily("bert", "bert.", offset_positions=False, classifier="pooler")
ROBERTA = EncoderFamily("roberta", "roberta.", offset_positions=True, classifier="dense")
XLM_ROBERTA = EncoderFamily("xlm-roberta", "roberta.", offset_positions=True, classifier="dense")
MODERNBERT = EncoderFamily(
    "modernbert",
    "model.",
    offset_positions=False,
    classifier="head",
    encoder="modernbert",
    config_fields=modernbert_fields,
)

ENCODERS = {family.model_type: family for family in (BERT, ROBERTA, XLM_ROBERTA, MODERNBERT)}
# config.json ``architectures`` -> (model_type, whether it carries a sequence classifier).
ARCHITECTURES = {
    "BertModel": ("bert", False),
    "BertForSequenceClassification": ("bert", True),
    "RobertaModel": ("roberta", False),
    "RobertaForSequenceClassification": ("roberta", True),
    "XLMRobertaModel": ("xlm-roberta", False),
    "XLMRobertaForSequenceClassification": ("xlm-roberta", True),
    "ModernBertModel": ("modernbert", False),
    "ModernBertForSequenceClassification": ("modernbert", True),
}


def encoder_family_of_hf(hf: dict) -> tuple[EncoderFamily, bool] | None:
    """The encoder family of a ``config.json`` and whether it is a sequence classifier (its
    ``architectures``; a bare ``model_type`` means the base model), or None: not an encoder."""
    for architecture in hf.get("architectures") or []:
        if architecture in ARCHITECTURES:
            model_type, classifies = ARCHITECTURES[architecture]
            return ENCODERS[model_type], classifies
        if architecture.endswith(("ForCausalLM", "ForConditionalGeneration")):
            return None
    family = ENCODERS.get(hf.get("model_type"))
    return None if family is None else (family, False)
