"""Encoder families: the BERT-shaped checkpoints that embed and score (never generate).

BERT, RoBERTa and XLM-RoBERTa share one encoder (``jaxgen.models.bert``): post-LayerNorm
blocks, absolute position embeddings, token type embeddings, GELU. What differs is declared
here: RoBERTa and XLM-R number positions from ``pad_token_id + 1`` (fairseq's offset), and
their sequence classifiers are ``classifier.dense`` + ``classifier.out_proj`` on ``<s>`` where
BERT's is its pooler (``pooler.dense``, tanh) then ``classifier``. Plain Python, beside the
decoder families; the decoder registry (``jaxgen.families``) never lists these.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class EncoderFamily:
    """``prefix``: the base model's tensor prefix in a ``*ForSequenceClassification``
    checkpoint; ``offset_positions``: positions start at ``pad_token_id + 1``;
    ``classifier``: "pooler" (BERT) or "dense" (RoBERTa's two-layer head)."""

    model_type: str
    prefix: str
    offset_positions: bool
    classifier: str


BERT = EncoderFamily("bert", "bert.", offset_positions=False, classifier="pooler")
ROBERTA = EncoderFamily("roberta", "roberta.", offset_positions=True, classifier="dense")
XLM_ROBERTA = EncoderFamily("xlm-roberta", "roberta.", offset_positions=True, classifier="dense")

ENCODERS = {family.model_type: family for family in (BERT, ROBERTA, XLM_ROBERTA)}
# config.json ``architectures`` -> (model_type, whether it carries a sequence classifier).
ARCHITECTURES = {
    "BertModel": ("bert", False),
    "BertForSequenceClassification": ("bert", True),
    "RobertaModel": ("roberta", False),
    "RobertaForSequenceClassification": ("roberta", True),
    "XLMRobertaModel": ("xlm-roberta", False),
    "XLMRobertaForSequenceClassification": ("xlm-roberta", True),
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
