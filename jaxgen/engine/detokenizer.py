"""An incremental detokenizer for streaming."""

from __future__ import annotations

import sys


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas, never emitting half a UTF-8 character.

    Decodes a short window of recent tokens (vLLM's prefix/read offsets) so each step costs O(1)
    tokens, and holds text back while it ends in the replacement character of an incomplete byte
    sequence.
    """

    def __init__(
        self,
        tokenizer,
        prompt_token_ids: list[int] | None = None,
        *,
        skip_special_tokens: bool = True,
    ):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # A fast tokenizer's own ``tokenizers`` backend decodes as its ``decode`` does with
        # ``clean_up_tokenization_spaces=False``, without the wrapper's Python (a few µs a
        # call, twice per token of every sequence of a step).
        self._backend = _plain_backend(tokenizer)
        self.token_ids: list[int] = list(prompt_token_ids or [])
        # Start the window a few tokens back into the prompt so the first word's spacing is right.
        self.read_offset = len(self.token_ids)
        self.prefix_offset = max(self.read_offset - 5, 0)
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        if self._backend is not None:
            return self._backend.decode(ids, skip_special_tokens=self.skip_special_tokens)
        return self.tokenizer.decode(
            ids, skip_special_tokens=self.skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def add_tokens(self, new_token_ids: list[int]) -> str:
        """Appends tokens and returns the newly completed text (possibly empty)."""
        delta = ""
        for token_id in new_token_ids:
            self.token_ids.append(token_id)
            prefix = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
            full = self._decode(self.token_ids[self.prefix_offset :])
            if len(full) > len(prefix) and not full.endswith("\ufffd"):
                delta += full[len(prefix) :]
                self.prefix_offset = self.read_offset
                self.read_offset = len(self.token_ids)
        self.text += delta
        return delta

    def add_token(self, token_id: int) -> None:
        """``add_tokens`` of one token, without building its delta."""
        token_ids = self.token_ids
        token_ids.append(token_id)
        prefix = self._decode(token_ids[self.prefix_offset : self.read_offset])
        full = self._decode(token_ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.text += full[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(token_ids)

    def flush(self) -> str:
        """Emits whatever is held back (at the end of a sequence)."""
        if self.read_offset >= len(self.token_ids):
            return ""
        prefix = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.token_ids[self.prefix_offset :])
        delta = full[len(prefix) :] if full.startswith(prefix) else ""
        self.read_offset = len(self.token_ids)
        self.text += delta
        return delta


def _plain_backend(tokenizer):
    """``tokenizer``'s ``tokenizers`` backend when its decode is the backend's: a
    class that says so (``decodes_with_backend``: jaxgen's ``PlainTokenizer``), or one whose
    decode is transformers' own (a class that overrides it keeps its decode); else None."""
    if getattr(type(tokenizer), "decodes_with_backend", False):
        return tokenizer.backend_tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    fast = getattr(sys.modules.get("transformers"), "PreTrainedTokenizerFast", None)
    if backend is None or fast is None:
        return None
    kind = type(tokenizer)
    if kind.decode is not fast.decode or getattr(kind, "_decode", None) is not fast._decode:
        return None
    return backend
