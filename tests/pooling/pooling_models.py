"""Tiny random pooling checkpoints (sentence-transformers files written beside a decoder, BERT /
RoBERTa / XLM-R / ModernBERT encoders and cross-encoders built with transformers) and the
references their outputs are checked against: transformers' hidden states pooled as
sentence-transformers does."""

from __future__ import annotations

import json
import os

import numpy as np

# Our pooling types -> sentence-transformers' pooling modes.
ST_MODES = {"LAST": "lasttoken", "MEAN": "mean", "CLS": "cls"}


def write_pooling_files(path: str, pooling_type: str, *, normalize: bool = True, dim: int = 64):
    """sentence-transformers' ``modules.json`` and ``1_Pooling/config.json`` in ``path`` (the
    legacy ``pooling_mode_*`` flags, as Qwen3-Embedding and e5-mistral ship them)."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if normalize:
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
    with open(os.path.join(path, "modules.json"), "w") as f:
        json.dump(modules, f)
    os.makedirs(os.path.join(path, "1_Pooling"), exist_ok=True)
    flags = {f"pooling_mode_{m}": False for m in ("cls_token", "mean_tokens", "lasttoken")}
    key = {"LAST": "lasttoken", "MEAN": "mean_tokens", "CLS": "cls_token"}[pooling_type]
    flags[f"pooling_mode_{key}"] = True
    with open(os.path.join(path, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": dim, **flags}, f)


def drop_chat_template(path: str) -> None:
    """Removes the tokenizer's chat template (sentence-transformers 6 renders plain text through
    a chat template when the tokenizer has one; embedding checkpoints embed text as it is)."""
    config_file = os.path.join(path, "tokenizer_config.json")
    with open(config_file) as f:
        config = json.load(f)
    config.pop("chat_template", None)
    with open(config_file, "w") as f:
        json.dump(config, f)
    for name in ("chat_template.jinja", "chat_template.json"):
        if os.path.exists(os.path.join(path, name)):
            os.remove(os.path.join(path, name))


def pooled(hidden: np.ndarray, pooling_type: str, normalize: bool = True) -> np.ndarray:
    """One sequence's hidden states [L, D] pooled as sentence-transformers pools them."""
    vector = {"LAST": hidden[-1], "MEAN": hidden.mean(0), "CLS": hidden[0]}[pooling_type]
    return vector / np.linalg.norm(vector) if normalize else vector


def hf_outputs(path: str, token_lists: list[list[int]], *, classifier: bool = False) -> list:
    """transformers' (fp32, eager attention) outputs, one sequence at a time (no padding):
    ``AutoModel``'s last hidden states [L, D] each, or with ``classifier`` its sequence
    classifier's logits [C] each."""
    import torch
    import transformers

    auto = transformers.AutoModelForSequenceClassification if classifier else transformers.AutoModel
    model = auto.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        outs = [model(torch.tensor([tokens])) for tokens in token_lists]
    return [(o.logits if classifier else o.last_hidden_state)[0].numpy() for o in outs]


def hf_hidden_states(path: str, token_lists: list[list[int]]) -> list[np.ndarray]:
    """transformers' ``AutoModel`` last hidden states [L, D], one sequence at a time."""
    return hf_outputs(path, token_lists)


def assert_probabilities_are_the_softmax_of_its_logits(path: str, texts: list[str]) -> None:
    """``LLM.classify``'s probabilities of ``texts`` are the softmax of transformers' logits."""
    from jaxgen import LLM

    outs = LLM(path).classify(texts)
    logits = hf_outputs(path, [out.prompt_token_ids for out in outs], classifier=True)
    for out, row in zip(outs, logits, strict=True):
        expected = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
        np.testing.assert_allclose(out.outputs.probs, expected, atol=1e-5)


def agreement(ours, reference) -> tuple[float, float]:
    """(max |difference|, smallest cosine) over rows of two [N, D] arrays."""
    ours, reference = np.asarray(ours, np.float64), np.asarray(reference, np.float64)
    cosine = (ours * reference).sum(-1) / (
        np.linalg.norm(ours, axis=-1) * np.linalg.norm(reference, axis=-1)
    )
    return float(np.abs(ours - reference).max()), float(cosine.min())


WORDS = (
    "the quick brown fox jumps over lazy dog hello world a an of to in is what capital "
    "france paris berlin city river embeddings pool sequence hidden states into one vector"
).split()
ENCODERS = {  # kind -> (config class, base model class, classifier class) in transformers
    "bert": ("BertConfig", "BertModel", "BertForSequenceClassification"),
    "roberta": ("RobertaConfig", "RobertaModel", "RobertaForSequenceClassification"),
    "xlm-roberta": ("XLMRobertaConfig", "XLMRobertaModel", "XLMRobertaForSequenceClassification"),
    "modernbert": ("ModernBertConfig", "ModernBertModel", "ModernBertForSequenceClassification"),
}
ROBERTA_KINDS = ("roberta", "xlm-roberta")  # fairseq's specials and position offset


def tiny_word_piece_tokenizer(roberta: bool, token_types: bool = True):
    """A WordPiece tokenizer over a small vocabulary; BERT's specials ([CLS] a [SEP] b [SEP],
    token types unless ``token_types`` is false, as ModernBERT's) or RoBERTa's
    (<s> a </s></s> b </s>, pad id 1, no token types)."""
    import tokenizers
    import transformers

    letters = list("abcdefghijklmnopqrstuvwxyz,.!?'")
    if roberta:
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    else:
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = specials + WORDS + letters + ["##" + c for c in letters]
    unk = specials[3] if roberta else specials[1]
    model = tokenizers.models.WordPiece({w: i for i, w in enumerate(vocab)}, unk_token=unk)
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = tokenizers.decoders.WordPiece()
    if roberta:
        tokenizer.post_processor = tokenizers.processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
        names = dict(bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>")
        return transformers.PreTrainedTokenizerFast(
            tokenizer_object=tokenizer,
            unk_token="<unk>",
            pad_token="<pad>",
            mask_token="<mask>",
            model_input_names=["input_ids", "attention_mask"],
            **names,
        )
    tokenizer.post_processor = tokenizers.processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    inputs = {} if token_types else {"model_input_names": ["input_ids", "attention_mask"]}
    return transformers.BertTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        **inputs,
    )


def save_tiny_encoder(
    path: str, kind: str, *, num_labels: int = 0, seed: int = 0, **overrides
) -> str:
    """A small random ``kind`` encoder (2 layers, hidden 64, 4 heads) with its tokenizer; with
    ``num_labels`` a sequence classifier (a cross-encoder for one label)."""
    import torch
    import transformers

    config_name, base_name, classifier_name = ENCODERS[kind]
    roberta = kind in ROBERTA_KINDS
    tokenizer = tiny_word_piece_tokenizer(roberta, token_types=kind != "modernbert")
    torch.manual_seed(seed)
    fields = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        num_labels=max(num_labels, 1),
    )
    if kind == "modernbert":  # its specials default to ids past a tiny vocabulary
        cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
        fields.update(bos_token_id=cls, cls_token_id=cls, eos_token_id=sep, sep_token_id=sep)
    fields.update(overrides)
    fields["max_position_embeddings"] += 2 if roberta else 0  # RoBERTa's padding offset
    config = getattr(transformers, config_name)(**fields)
    model_class = getattr(transformers, classifier_name if num_labels else base_name)
    model = model_class(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
            elif "norm" in name.lower():  # BERT's LayerNorm, ModernBERT's *norm
                p.normal_(1.0, 0.1)
            else:
                p.normal_(0.0, 0.05)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path
