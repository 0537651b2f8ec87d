"""A GGUF file's tokenizer, tokenizing as llama.cpp does.

llama.cpp stores no ``tokenizer.json`` in a GGUF: the vocabulary, merges or SentencePiece
scores, token types, special token ids and chat template are metadata under ``tokenizer.*``.
``GGUFTokenizer`` reads them as llama.cpp's loader does (``jaxgen.loaders.gguf_vocab``) and
encodes and decodes with llama.cpp's algorithms (``jaxgen.loaders.llama_tokenize``), so a prompt
gives the ids ``llama_tokenize`` gives: tests/loaders/test_llama_cpp_tokenization.py checks
them against llama.cpp over every tokenizer variant. It speaks the part of transformers'
tokenizer interface jaxgen and its server use (``encode``, ``decode``, ``apply_chat_template``,
special tokens, the vocabulary), without importing transformers.

Special tokens in text: ``encode`` parses them (llama.cpp's ``parse_special=True``), as
llama.cpp's server does for prompts and rendered chat templates, as vLLM (through transformers)
does, and as jaxgen always has; ``split_special_tokens = True`` (transformers' switch) or
``encode(..., parse_special=False)`` treats them as text, user-defined tokens excepted (llama.cpp
keeps those whole either way).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from jaxgen.loaders.gguf_vocab import CONTROL, UNKNOWN, USER_DEFINED, GGUFVocab, gguf_vocab
from jaxgen.loaders.llama_tokenize import LlamaTokenize
from jaxgen.loaders.tokenizer_methods import TokenizerMethods

# The metadata a GGUF tokenizer is built from (llama.cpp reads the model's name and
# architecture for some token attributes).
KEPT_FIELDS = ("tokenizer.", "general.name", "general.architecture")


class GGUFTokenizer(TokenizerMethods):
    """llama.cpp's tokenizer for one GGUF vocabulary, behind transformers' method names."""

    # ``decode`` is not a ``tokenizers`` backend's (the streaming detokenizer calls ``decode``).
    decodes_with_backend = False
    is_fast = True

    def __init__(self, vocab: GGUFVocab, metadata: Mapping[str, object] | None = None):
        """
        Args:
            vocab: the vocabulary as llama.cpp loads it.
            metadata: the file's fields the vocabulary came from (``KEPT_FIELDS``), kept for
                ``to_transformers`` and the cache (None: not available).
        """
        self.vocab = vocab
        self._tokenize = LlamaTokenize(vocab)
        self.metadata = metadata
        tokens = vocab.tokens
        self.special_tokens_map = {
            name: tokens[i]
            for name, i in (
                ("bos_token", vocab.bos_id),
                ("eos_token", vocab.eos_id),
                ("unk_token", vocab.unk_id),
                ("pad_token", vocab.pad_id),
            )
            if i is not None
        }
        self.chat_template = vocab.chat_template
        self.add_bos_token = vocab.add_bos
        self.add_eos_token = vocab.add_eos
        self.split_special_tokens = False
        self.name_or_path = ""

    # -- vocabulary ----------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.vocab.tokens)

    def __len__(self) -> int:
        return len(self.vocab.tokens)

    def get_vocab(self) -> dict[str, int]:
        return dict(self._tokenize.ids)

    @functools.cached_property
    def _added(self) -> dict[str, int]:
        marked = CONTROL | USER_DEFINED | UNKNOWN
        return {t: i for i, t in enumerate(self.vocab.tokens) if self.vocab.attrs[i] & marked}

    def get_added_vocab(self) -> dict[str, int]:
        """The tokens llama.cpp keeps whole in text: control, user-defined and unknown ones."""
        return dict(self._added)

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | None | list[int | None]:
        ids = self._tokenize.ids
        if isinstance(tokens, str):
            return ids.get(tokens)
        return [ids.get(token) for token in tokens]

    def convert_ids_to_tokens(
        self, ids: int | list[int], skip_special_tokens: bool = False
    ) -> str | None | list[str]:
        tokens = self.vocab.tokens
        if isinstance(ids, int):
            return tokens[ids] if 0 <= ids < len(tokens) else None
        hidden = self._tokenize.hidden
        return [tokens[i] for i in ids if not (skip_special_tokens and hidden[i])]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return self.decode([self._tokenize.ids[token] for token in tokens])

    # -- special tokens ------------------------------------------------------------------------
    def __getattr__(self, name: str):
        # bos_token, bos_token_id, ... (None where the vocabulary has none).
        names = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token")
        special = self.__dict__.get("special_tokens_map", {})
        if name in names + ("mask_token",):
            return special.get(name)
        if name.endswith("_id") and name[:-3] in names + ("mask_token",):
            token = special.get(name[:-3])
            return None if token is None else self._tokenize.ids[token]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- text <-> ids --------------------------------------------------------------------------
    def encode(
        self, text: str, add_special_tokens: bool = True, parse_special: bool | None = None
    ) -> list[int]:
        """``llama_tokenize(text, add_special=add_special_tokens, parse_special)``;
        ``parse_special`` defaults to ``not split_special_tokens`` (True)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a string, not {type(text).__name__}")
        if parse_special is None:
            parse_special = not self.split_special_tokens
        return self._tokenize.encode(text, add_special_tokens, parse_special)

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[str]:
        tokens = self.vocab.tokens
        return [tokens[i] for i in self.encode(text, add_special_tokens=add_special_tokens)]

    def decode(
        self,
        token_ids: int | list[int],
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
    ) -> str:
        """The tokens' ``llama_token_to_piece`` texts joined (control and unknown tokens
        dropped with ``skip_special_tokens``), the space ``encode`` prefixed dropped, invalid
        UTF-8 as U+FFFD. ``clean_up_tokenization_spaces`` is accepted and not applied: joined
        pieces are what llama.cpp's server streams, and what round-trips."""
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        data = self._tokenize.decode_bytes(list(token_ids), skip_special_tokens)
        return data.decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """``llama_token_to_piece(token_id, special=True)``."""
        return self._tokenize.pieces[token_id]

    # -- other libraries -----------------------------------------------------------------------
    def llguidance_tokenizer(self, n_vocab: int, eos_token_ids):
        """llguidance's tokenizer: every token's bytes (control tokens marked as llguidance's
        llama.cpp binding marks them) and this tokenizer's ``encode``."""
        import llguidance

        tokens = []
        for i, piece in enumerate(self._tokenize.pieces):
            attr = self.vocab.attrs[i]
            angled = piece.startswith(b"<") and piece.endswith(b">")
            if attr & CONTROL or (attr & USER_DEFINED and angled):
                piece = b"\xff" + piece
            tokens.append(piece)
        padding = list(range(len(tokens), n_vocab))  # logits without a token: never allowed
        tokens += [b""] * len(padding)
        source = _LLGuidanceSource(self, tokens, padding)
        eos = list(eos_token_ids) or self.eos_token_id
        return llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(source), n_vocab=n_vocab, eos_token=eos
        )

    def to_transformers(self):
        """transformers' form of this vocabulary (``PreTrainedTokenizerFast``, built as its GGUF
        converter builds it: it tokenizes as transformers does, which for some variants is
        not llama.cpp's way)."""
        if self.metadata is None:
            raise ValueError("this GGUFTokenizer was built without the file's metadata")
        from jaxgen.loaders.gguf_tokenizers_pipeline import tokenizers_pipeline

        return tokenizers_pipeline(self.metadata).to_transformers()

    def __repr__(self) -> str:
        kind = self.vocab.model + (f"/{self.vocab.pre_name}" if self.vocab.pre_name else "")
        return f"GGUFTokenizer({kind}, vocab={len(self)}, special={self.special_tokens_map})"


class _LLGuidanceSource:
    """What ``llguidance.TokenizerWrapper`` reads from a tokenizer."""

    def __init__(self, tokenizer: GGUFTokenizer, tokens: list[bytes], padding: list[int]):
        self.tokens = tokens
        self.eos_token_id = tokenizer.eos_token_id
        self.bos_token_id = tokenizer.bos_token_id
        self.special_token_ids = sorted(tokenizer.get_added_vocab().values()) + padding
        self._encode = tokenizer.encode

    def __call__(self, text: str) -> list[int]:
        if isinstance(text, bytes):
            raise TypeError("text, not bytes")  # TokenizerWrapper then passes str
        return self._encode(text, add_special_tokens=False, parse_special=False)


def gguf_tokenizer(metadata: Mapping[str, object]) -> GGUFTokenizer:
    """The tokenizer a GGUF file's metadata (``GGUFReader(path).fields``) describes.

    Raises:
        ValueError: no vocabulary, a ``tokenizer.ggml.model`` or ``tokenizer.ggml.pre`` jaxgen
            does not tokenize exactly (the message names the field).
    """
    kept = {key: metadata[key] for key in metadata if key.startswith(KEPT_FIELDS)}
    return GGUFTokenizer(gguf_vocab(kept), kept)
