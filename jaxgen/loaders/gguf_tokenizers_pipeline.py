"""The ``tokenizers`` pipeline transformers' GGUF converter builds for a GGUF file's vocabulary.

It is not how jaxgen tokenizes a GGUF file (``jaxgen.loaders.gguf_tokenizer`` tokenizes as
llama.cpp does): it is the form a GGUF tokenizer takes when it has to be a transformers
tokenizer (``GGUFTokenizer.to_transformers``, ``save_pretrained``). It follows what
``AutoTokenizer.from_pretrained(dir, gguf_file=...)`` builds (tests/loaders/test_gguf_tokenizer.py
compares them), with ``tokenizer.ggml.add_space_prefix`` honoured. Two kinds: ``gpt2``
(byte-level BPE with merges; the pre-tokenizer split chosen by ``tokenizer.ggml.pre``) and
``llama`` (SentencePiece BPE with byte fallback; merges recovered from the scores).
"""

from __future__ import annotations

from collections.abc import Mapping

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from jaxgen.loaders.llama_tokenize import byte_alphabet
from jaxgen.loaders.plain_tokenizer import PlainTokenizer

SUPPORTED_TOKENIZER_MODELS = ("gpt2", "llama")

# llama.cpp's token types (gguf.TokenType).
CONTROL = 3
USER_DEFINED = 4

_SPECIAL_TOKEN_KEYS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}

# How byte-level vocabularies split text before BPE, by ``tokenizer.ggml.pre``; a name not listed
# keeps GPT-2's own split (the ByteLevel pre-tokenizer's regex).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS = {
    **dict.fromkeys(
        (
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
            "dbrx",
            "smaug-bpe",
        ),
        _LLAMA3_SPLIT,
    ),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2_SPLIT),
    "qwen35": _QWEN35_SPLIT,
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O_SPLIT),
    "tekken": _TEKKEN_SPLIT,
}


def tokenizers_pipeline(metadata: Mapping[str, object]) -> PlainTokenizer:
    """transformers' tokenizer for the GGUF file whose metadata is ``metadata``.

    Args:
        metadata: the file's metadata fields (``GGUFReader(path).fields``: key -> value).

    Raises:
        ValueError: the file has no vocabulary, or a tokenizer kind other than ``gpt2``/``llama``.
    """
    fields = metadata
    kind = fields.get("tokenizer.ggml.model")
    tokens = fields.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ValueError("GGUF file has no tokenizer.ggml.tokens: it carries no tokenizer")
    if kind not in SUPPORTED_TOKENIZER_MODELS:
        raise ValueError(
            f"unsupported GGUF tokenizer.ggml.model {kind!r}; supported: "
            f"{', '.join(SUPPORTED_TOKENIZER_MODELS)}"
        )
    merges = fields.get("tokenizer.ggml.merges")
    token_types = fields.get("tokenizer.ggml.token_type") or []
    if kind == "gpt2":
        backend = _byte_level_bpe(tokens, merges, fields.get("tokenizer.ggml.pre"))
    else:
        prefix = fields.get("tokenizer.ggml.add_space_prefix")
        backend = _sentencepiece_bpe(
            tokens, merges, fields.get("tokenizer.ggml.scores"), prefix is None or bool(prefix)
        )
    _add_marked_tokens(backend, tokens, token_types, byte_level=kind == "gpt2")

    options = {}
    for name, key in _SPECIAL_TOKEN_KEYS.items():
        token_id = fields.get(key)
        options[name] = tokens[token_id] if token_id is not None else None
    add_bos = fields.get("tokenizer.ggml.add_bos_token")
    if add_bos is None and kind == "llama":
        add_bos = True  # llama.cpp adds BOS to a SentencePiece vocabulary that does not say
    for name, value in (
        ("add_bos_token", add_bos),
        ("add_eos_token", fields.get("tokenizer.ggml.add_eos_token")),
        ("chat_template", fields.get("tokenizer.chat_template")),
    ):
        if value is not None:
            options[name] = value
    return PlainTokenizer(backend, **options)


def _byte_level_bpe(tokens: list[str], merges: list[str] | None, pre: str | None) -> Tokenizer:
    if not merges:
        raise ValueError("GGUF gpt2 tokenizer has no tokenizer.ggml.merges")
    spelling = byte_alphabet()
    alphabet = set(spelling.values())
    # A token written in raw text (a mislabelled special, say) is respelled in the byte alphabet.
    vocab = {
        token
        if set(token) <= alphabet
        else "".join(spelling[byte] for byte in token.encode("utf-8")): index
        for index, token in enumerate(tokens)
    }
    backend = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=[tuple(merge.split(" ")) for merge in merges],
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
        )
    )
    split = PRE_TOKENIZER_SPLITS.get(pre)
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    backend.decoder = decoders.ByteLevel()
    return backend


def _sentencepiece_bpe(
    tokens: list[str], merges: list[str] | None, scores: list[float] | None, prefix: bool
) -> Tokenizer:
    vocab = {token: index for index, token in enumerate(tokens)}
    if merges:
        pairs = [tuple(merge.split(" ")) for merge in merges]
    elif scores is not None:
        pairs = merges_from_scores(vocab, dict(zip(tokens, scores, strict=True)))
    else:
        raise ValueError("GGUF llama tokenizer has neither tokenizer.ggml.merges nor .scores")
    backend = Tokenizer(
        models.BPE(vocab=vocab, merges=pairs, fuse_unk=True, byte_fallback=True, dropout=None)
    )
    backend.normalizer = None
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="first" if prefix else "never", split=False
    )
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:  # the space the pre-tokenizer prepended
        steps.append(decoders.Strip(content=" ", left=1))
    backend.decoder = decoders.Sequence(steps)
    return backend


def merges_from_scores(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary: every split of a token into two tokens,
    best score first (ties: longer left part, then longer right part, then vocabulary order)."""
    candidates = []
    for token, score in scores.items():
        splits = [
            (token[:cut], token[cut:], score)
            for cut in range(1, len(token))
            if token[:cut] in vocab and token[cut:] in vocab
        ]
        splits.sort(key=lambda split: (vocab[split[0]], vocab[split[1]]))
        candidates.extend(splits)
    candidates.sort(key=lambda c: (c[2], len(c[0]), len(c[1])), reverse=True)
    return [(left, right) for left, right, _ in candidates]


def _add_marked_tokens(
    backend: Tokenizer, tokens: list[str], token_types: list[int], *, byte_level: bool
) -> None:
    """Control tokens become special added tokens and user-defined ones plain added tokens, so
    text containing them keeps them whole (as llama.cpp does). In a byte-level vocabulary a
    control token spelled outside the byte alphabet is a mislabel and is skipped."""
    alphabet = set(byte_alphabet().values()) if byte_level else None
    control = [
        AddedToken(token, normalized=False, special=True)
        for token, token_type in zip(tokens, token_types, strict=False)
        if token_type == CONTROL and (alphabet is None or set(token) <= alphabet)
    ]
    if control:
        backend.add_special_tokens(control)
    vocab = backend.get_vocab()
    user_defined = [
        AddedToken(token, normalized=False, special=False)
        for token, token_type in zip(tokens, token_types, strict=False)
        if token_type == USER_DEFINED and token in vocab
    ]
    if user_defined:
        backend.add_tokens(user_defined)
