"""Token texts for watching tags in generated tokens: each id's text (cached), the ids whose
text is an exact piece of a tag, and text back to ids. One ``TokenTexts`` per tokenizer, shared
(``token_texts``)."""

from __future__ import annotations

import functools
import threading


class TokenTexts:
    """What the reasoning gate reads of one tokenizer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.text = functools.lru_cache(maxsize=65536)(self._decode)
        self._pieces: dict[str, dict[int, list[tuple[int, int]]]] = {}
        self._lock = threading.Lock()

    def _decode(self, token_id: int) -> str:
        try:
            return self.tokenizer.decode(
                [token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        except Exception:  # an id the tokenizer does not know (padding rows of the logits)
            return ""

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def pieces(self, tag: str) -> dict[int, list[tuple[int, int]]]:
        """``{i: [(token_id, j), ...]}``: the tokens whose text is exactly ``tag[i:j]``, for
        each offset ``i`` in the tag (the ways to go on writing it from there)."""
        with self._lock:
            cached = self._pieces.get(tag)
        if cached is not None:
            return cached
        pieces: dict[int, list[tuple[int, int]]] = {i: [] for i in range(len(tag))}
        for i in range(len(tag)):
            for j in range(i + 1, len(tag) + 1):
                ids = self.encode(tag[i:j])
                if len(ids) == 1 and self.text(ids[0]) == tag[i:j]:
                    pieces[i].append((ids[0], j))
        with self._lock:
            self._pieces[tag] = pieces
        return pieces


_TEXTS: dict[int, TokenTexts] = {}
_TEXTS_LOCK = threading.Lock()


def token_texts(tokenizer) -> TokenTexts:
    """The shared ``TokenTexts`` of ``tokenizer`` (it holds the tokenizer, so its id stays its
    own)."""
    with _TEXTS_LOCK:
        texts = _TEXTS.get(id(tokenizer))
        if texts is None:
            texts = _TEXTS[id(tokenizer)] = TokenTexts(tokenizer)
        return texts
