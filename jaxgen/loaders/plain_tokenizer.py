"""A tokenizer served by the ``tokenizers`` package alone: what jaxgen and its server use of a
transformers fast tokenizer, without importing transformers (a second or more of start-up).

``PlainTokenizer`` behaves as ``transformers.PreTrainedTokenizerFast(tokenizer_object=backend,
bos_token=..., ...)`` does for the same backend: the named special tokens are special added
tokens, BOS/EOS are added by a ``TemplateProcessing`` post-processor as transformers sets it,
``decode`` is the backend's, and ``apply_chat_template`` renders as transformers renders
(``jaxgen.loaders.chat_template``). tests/loaders/test_gguf_tokenizer.py checks all of it against
transformers. ``to_transformers`` builds that transformers tokenizer when one is needed
(``save_pretrained``).
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, processors

from jaxgen.loaders.tokenizer_methods import TokenizerMethods

# transformers' named special tokens, in its order.
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


class PlainTokenizer(TokenizerMethods):
    """A ``tokenizers.Tokenizer`` with named special tokens and a chat template."""

    # ``decode`` is the backend's own (the streaming detokenizer calls the backend directly).
    decodes_with_backend = True

    def __init__(
        self,
        backend: Tokenizer,
        *,
        add_bos_token: bool = False,
        add_eos_token: bool = False,
        chat_template: str | dict | None = None,
        **special_tokens: str | None,
    ):
        """
        Args:
            backend: the pipeline (taken over: its post-processor and added tokens are set here).
            add_bos_token, add_eos_token: ``encode(add_special_tokens=True)`` adds them.
            chat_template: a jinja template, or a dict of named ones.
            special_tokens: ``bos_token``, ``eos_token``, ... (``SPECIAL_TOKEN_NAMES``): texts.
        """
        unknown = sorted(set(special_tokens) - set(SPECIAL_TOKEN_NAMES))
        if unknown:
            raise ValueError(f"unknown special token names {unknown}; known: {SPECIAL_TOKEN_NAMES}")
        self._backend = backend
        self._backend.no_truncation()
        self.special_tokens_map = {
            name: special_tokens[name]
            for name in SPECIAL_TOKEN_NAMES
            if special_tokens.get(name) is not None
        }
        self.chat_template = chat_template
        self.split_special_tokens = False
        self.name_or_path = ""
        added = set(self.get_added_vocab())
        missing = [t for t in self.special_tokens_map.values() if t not in added]
        if missing:  # as transformers does: a named special token is a special added token
            self._backend.add_tokens([AddedToken(t, special=True) for t in dict.fromkeys(missing)])
        self.add_bos_token = bool(add_bos_token) and self.bos_token is not None
        self.add_eos_token = bool(add_eos_token) and self.eos_token is not None
        self._set_post_processor()

    def _set_post_processor(self) -> None:
        bos, eos = self.bos_token, self.eos_token
        single = f"{(bos + ':0 ') if self.add_bos_token else ''}$A:0"
        single += f"{(' ' + eos + ':0') if self.add_eos_token else ''}"
        pair = f"{single}{(' ' + bos + ':1') if self.add_bos_token else ''} $B:1"
        pair += f"{(' ' + eos + ':1') if self.add_eos_token else ''}"
        special = []
        if self.add_bos_token:
            special.append((bos, self.bos_token_id))
        if self.add_eos_token:
            special.append((eos, self.eos_token_id))
        self._backend.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=special
        )

    # -- vocabulary ----------------------------------------------------------------------------
    @property
    def backend_tokenizer(self) -> Tokenizer:
        return self._backend

    @property
    def is_fast(self) -> bool:
        return True

    @property
    def vocab_size(self) -> int:
        """The base vocabulary's size (without added tokens)."""
        return self._backend.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        """The full vocabulary's size (with added tokens)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self._backend.get_vocab(with_added_tokens=True)

    @property
    def added_tokens_decoder(self) -> dict[int, AddedToken]:
        return self._backend.get_added_tokens_decoder()

    def get_added_vocab(self) -> dict[str, int]:
        return {token.content: i for i, token in sorted(self.added_tokens_decoder.items())}

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | None | list[int | None]:
        if isinstance(tokens, str):
            return self._backend.token_to_id(tokens)
        return [self._backend.token_to_id(token) for token in tokens]

    def convert_ids_to_tokens(
        self, ids: int | list[int], skip_special_tokens: bool = False
    ) -> str | None | list[str]:
        if isinstance(ids, int):
            return self._backend.id_to_token(ids)
        special = set(self.all_special_ids) if skip_special_tokens else ()
        return [self._backend.id_to_token(i) for i in ids if i not in special]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        decoder = self._backend.decoder
        return decoder.decode(tokens) if decoder is not None else " ".join(tokens)

    # -- special tokens ------------------------------------------------------------------------
    def __getattr__(self, name: str):
        # bos_token, bos_token_id, ... (None where the tokenizer has none).
        if name in SPECIAL_TOKEN_NAMES:
            return self.__dict__.get("special_tokens_map", {}).get(name)
        if name.endswith("_id") and name[:-3] in SPECIAL_TOKEN_NAMES:
            token = self.__dict__.get("special_tokens_map", {}).get(name[:-3])
            return None if token is None else self._backend.token_to_id(token)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- text <-> ids --------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[str]:
        return self._backend.encode(text, add_special_tokens=add_special_tokens).tokens

    def decode(
        self,
        token_ids: int | list[int],
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
    ) -> str:
        """The backend's decode. ``clean_up_tokenization_spaces`` is accepted and not applied,
        as transformers does for BPE vocabularies (the only kind ``gguf_tokenizer`` builds)."""
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        return self._backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    # -- transformers --------------------------------------------------------------------------
    def to_transformers(self):
        """The same tokenizer as a ``transformers.PreTrainedTokenizerFast``."""
        from jaxgen.loaders.transformers_import import transformers

        options = dict(self.special_tokens_map)
        options.update(add_bos_token=self.add_bos_token, add_eos_token=self.add_eos_token)
        if self.chat_template is not None:
            options["chat_template"] = self.chat_template
        return transformers().PreTrainedTokenizerFast(tokenizer_object=self._backend, **options)

    def __repr__(self) -> str:
        return f"PlainTokenizer(vocab={len(self)}, special={self.special_tokens_map})"
