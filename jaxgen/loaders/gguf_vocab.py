"""A GGUF file's vocabulary as llama.cpp's loader reads it (``llama_vocab::impl::load``).

llama.cpp derives more from the metadata than the fields say: defaults by tokenizer kind
(SentencePiece adds BOS and a space prefix; byte-level BPE neither, unless its pre-tokenizer
says), BOS/EOS ids when absent, and token attributes it sets by token text (an ``<|im_end|>``
typed normal becomes a control token, the ``rstrip`` of Phi-3's special tokens, ...). What
``GGUFVocab`` holds is what its ``llama_tokenize`` and ``llama_token_to_piece`` then use.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

from jaxgen.loaders.llama_pre_tokenizers import PreTokenizer, pre_tokenizer

# llama.cpp's token attributes (llama_token_attr), from the file's token types.
UNDEFINED = 0
UNKNOWN = 1 << 0
UNUSED = 1 << 1
NORMAL = 1 << 2
CONTROL = 1 << 3
USER_DEFINED = 1 << 4
BYTE = 1 << 5
LSTRIP = 1 << 7
RSTRIP = 1 << 8
_ATTR_OF_TYPE = {1: NORMAL, 2: UNKNOWN, 3: CONTROL, 4: USER_DEFINED, 5: UNUSED, 6: BYTE}

SUPPORTED_TOKENIZER_MODELS = ("gpt2", "llama")
# Kinds llama.cpp knows that jaxgen does not tokenize (WordPiece, Unigram, RWKV, ...).
KNOWN_TOKENIZER_MODELS = ("bert", "t5", "rwkv", "plamo2", "gemma4", "hybriddna", "whitespace")

# Texts llama.cpp makes control tokens whatever the file says (end of turn / generation and
# fill-in-the-middle markers), and the few it makes user-defined (gpt-oss's).
_EOG_TEXTS = frozenset(
    "<|eot_id|> <|im_end|> <|end|> <|return|> <|call|> <|flush|> <|calls|> <end_of_turn> "
    "<|endoftext|> </s> <|eom_id|> <EOT> _<EOT> [EOT] [EOS] <|end_of_text|> "
    "<end_of_utterance> <eos> <turn|> <|tool_response> <｜end▁of▁sentence｜> [e~[".split()
)
_FIM_TEXTS = {
    "fim_pre": "<|fim_prefix|> <fim-prefix> <fim_prefix> <｜fim▁begin｜> <PRE> ▁<PRE> "
    "<|code_prefix|> <|prefix|>",
    "fim_suf": "<|fim_suffix|> <fim-suffix> <fim_suffix> <｜fim▁hole｜> <SUF> ▁<SUF> "
    "<|code_suffix|> <|suffix|>",
    "fim_mid": "<|fim_middle|> <fim-middle> <fim_middle> <｜fim▁end｜> <MID> ▁<MID> "
    "<|code_middle|> <|middle|>",
    "fim_pad": "<|fim_pad|> <fim-pad> <fim_pad> <PAD> [PAD]",
    "fim_rep": "<|fim_repo|> <|repo_name|> <fim-repo> <REPO> <reponame>",
    "fim_sep": "<|file_sep|>",
}
_ALWAYS_USER_DEFINED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")


@dataclass
class GGUFVocab:
    """llama.cpp's view of a GGUF vocabulary.

    Attributes:
        model: ``tokenizer.ggml.model``: ``llama`` (SentencePiece) or ``gpt2`` (byte-level BPE).
        tokens: token texts by id (an empty one as llama.cpp renames it, ``[EMPTY_<id>]``).
        scores: SentencePiece scores by id (0 where the file has none).
        attrs: llama.cpp's attributes by id (``NORMAL``, ``CONTROL``, ... bits).
        merges: byte-level BPE merges, best first, as (left, right) pairs.
        pre: the byte-level pre-tokenizer (None for SentencePiece).
        bos_id, eos_id, unk_id, pad_id: special ids (None: none).
        add_bos, add_eos, add_space_prefix: what ``llama_tokenize`` adds.
        chat_template: ``tokenizer.chat_template`` (None if absent).
    """

    model: str
    tokens: list[str]
    scores: list[float]
    attrs: list[int]
    merges: list[tuple[str, str]] = field(default_factory=list)
    pre: PreTokenizer | None = None
    pre_name: str | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    unk_id: int | None = None
    pad_id: int | None = None
    add_bos: bool = False
    add_eos: bool = False
    add_space_prefix: bool = False
    chat_template: str | None = None


def gguf_vocab(fields: Mapping[str, object]) -> GGUFVocab:
    """The vocabulary the GGUF metadata ``fields`` describe, as llama.cpp loads it.

    Raises:
        ValueError: no vocabulary, a ``tokenizer.ggml.model`` jaxgen does not tokenize, an
            unknown ``tokenizer.ggml.pre``, or fields llama.cpp would refuse (no merges).
    """
    model = fields.get("tokenizer.ggml.model")
    tokens = list(fields.get("tokenizer.ggml.tokens") or [])
    if model is None or not tokens:
        raise ValueError("GGUF file has no tokenizer.ggml.model/.tokens: it carries no tokenizer")
    if model not in SUPPORTED_TOKENIZER_MODELS:
        known = " (llama.cpp knows it; jaxgen does not tokenize it)"
        raise ValueError(
            f"unsupported GGUF tokenizer.ggml.model {model!r}"
            f"{known if model in KNOWN_TOKENIZER_MODELS else ''}; supported: "
            f"{', '.join(SUPPORTED_TOKENIZER_MODELS)}"
        )
    n = len(tokens)
    tokens = [token or f"[EMPTY_{i}]" for i, token in enumerate(tokens)]
    scores = [float(s) for s in fields.get("tokenizer.ggml.scores") or [0.0] * n]
    types = fields.get("tokenizer.ggml.token_type")
    for key, values in (("scores", scores), ("token_type", types)):
        if values is not None and len(values) < n:
            raise ValueError(f"GGUF tokenizer.ggml.{key} has {len(values)} entries for {n} tokens")
    attrs = [NORMAL] * n if types is None else [_ATTR_OF_TYPE.get(t, UNDEFINED) for t in types]
    vocab = GGUFVocab(model=model, tokens=tokens, scores=scores[:n], attrs=attrs[:n])
    if model == "llama":
        bos, eos, unk, pad = 1, 2, 0, None
        vocab.add_bos, vocab.add_space_prefix = True, True
    else:
        merges = fields.get("tokenizer.ggml.merges")
        if not merges:
            raise ValueError("GGUF gpt2 tokenizer has no tokenizer.ggml.merges")
        vocab.merges = [_merge_pair(merge) for merge in merges]
        vocab.pre_name = fields.get("tokenizer.ggml.pre")
        vocab.pre = pre_tokenizer(vocab.pre_name)
        bos, eos, unk, pad = (None if vocab.pre.no_bos else 11), 11, None, None
        vocab.add_bos = vocab.pre.add_bos
    prefix = fields.get("tokenizer.ggml.add_space_prefix")
    if prefix is not None:
        vocab.add_space_prefix = bool(prefix)
    vocab.bos_id = _special_id(fields, "bos_token_id", bos, n)
    vocab.eos_id = _special_id(fields, "eos_token_id", eos, n)
    vocab.unk_id = _special_id(fields, "unknown_token_id", unk, n)
    vocab.pad_id = _special_id(fields, "padding_token_id", pad, n)
    for name in ("add_bos", "add_eos"):
        value = fields.get(f"tokenizer.ggml.{name}_token")
        if value is not None:
            setattr(vocab, name, bool(value))
    if vocab.add_bos and vocab.bos_id is None:  # llama.cpp would abort on tokenizing
        warnings.warn("GGUF tokenizer adds BOS but has no BOS token: not adding it", stacklevel=2)
        vocab.add_bos = False
    if vocab.add_eos and vocab.eos_id is None:
        vocab.add_eos = False
    vocab.chat_template = fields.get("tokenizer.chat_template")
    _set_attributes_by_text(vocab, fields)
    return vocab


def _merge_pair(merge: str) -> tuple[str, str]:
    cut = merge.find(" ", 1)  # as llama.cpp: the first space after the first character
    return (merge[:cut], merge[cut + 1 :]) if cut != -1 else ("", "")


def _special_id(fields: Mapping, key: str, default: int | None, n: int) -> int | None:
    if default is not None and default >= n:
        default = None  # llama.cpp: a default id out of the vocabulary is disabled
    value = fields.get(f"tokenizer.ggml.{key}")
    if value is None or not 0 <= int(value) < n:
        return default
    return int(value)


def _set_attributes_by_text(vocab: GGUFVocab, fields: Mapping) -> None:
    """The attributes llama.cpp sets by token text and model name, in its order."""
    ids = {token: i for i, token in enumerate(vocab.tokens)}  # the last id of a text wins
    attrs = vocab.attrs
    for name, texts in _FIM_TEXTS.items():
        if fields.get(f"tokenizer.ggml.{name}_token_id") is None:
            for text in texts.split():
                if text in ids:  # llama.cpp takes the first it meets: each candidate here
                    attrs[ids[text]] |= CONTROL
    for text, i in ids.items():
        if attrs[i] & CONTROL and "unused" in text:
            attrs[i] |= UNUSED
    eog = {ids[text] for text in _EOG_TEXTS if text in ids}
    for i in eog:
        attrs[i] |= CONTROL
    for text in _ALWAYS_USER_DEFINED:
        if text in ids:
            attrs[ids[text]] = USER_DEFINED
    eog |= {i for i in (vocab.eos_id,) if i is not None}
    eog_texts = {vocab.tokens[i] for i in eog}
    has_call = bool(eog_texts & {"<|call|>", "<|calls|>"})
    if "<|end|>" in eog_texts and has_call and eog_texts & {"<|return|>", "<|flush|>"}:
        attrs[ids["<|end|>"]] = USER_DEFINED
    if "</s>" in eog_texts and eog_texts & {"<|tool_response>", "<|plamo:eos|>"}:
        attrs[ids["</s>"]] = NORMAL
    name = str(fields.get("general.name") or "").lower()
    pre = vocab.pre_name or ""
    arch = str(fields.get("general.architecture") or "")
    if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
        s in arch for s in ("nomic-bert-moe", "jina-bert-v3")
    ):
        if "<mask>" in ids:
            attrs[ids["<mask>"]] |= LSTRIP
    elif "phi-3" in name or "phi3" in name:
        for i, attr in enumerate(attrs):
            if attr & (CONTROL | USER_DEFINED | UNKNOWN):
                attrs[i] |= RSTRIP
        _set(attrs, ids, "</s>", RSTRIP, True)
        for text in ("<unk>", "<s>", "<|endoftext|>"):
            _set(attrs, ids, text, RSTRIP, False)
    elif "modern-bert" in name and "[MASK]" in ids:
        attrs[ids["[MASK]"]] |= LSTRIP


def _set(attrs: list[int], ids: dict[str, int], text: str, bit: int, value: bool) -> None:
    if text not in ids:
        raise ValueError(f"GGUF vocabulary of a Phi-3 model has no {text!r} token")
    i = ids[text]
    attrs[i] = attrs[i] | bit if value else attrs[i] & ~bit
