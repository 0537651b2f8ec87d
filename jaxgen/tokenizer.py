"""Tokenizers (from a HF directory or a GGUF file) and an incremental detokenizer for streaming."""

from __future__ import annotations

import hashlib
import os

DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "jaxgen", "tokenizers")


def load_tokenizer(path: str, gguf_file: str | None = None):
    """A ``transformers`` tokenizer from a checkpoint directory, or from a GGUF file's metadata.

    Building a tokenizer from GGUF metadata takes seconds, so the result is cached on disk
    (``$JAXGEN_CACHE_DIR`` or ``~/.cache/jaxgen/tokenizers``) keyed by the file's size and mtime.
    """
    from transformers import AutoTokenizer

    if gguf_file is None:
        return AutoTokenizer.from_pretrained(path)
    full = os.path.join(path, gguf_file)
    stat = os.stat(full)
    key = hashlib.sha1(
        f"{os.path.abspath(full)}:{stat.st_size}:{stat.st_mtime_ns}".encode()
    ).hexdigest()
    cache_dir = os.path.join(os.environ.get("JAXGEN_CACHE_DIR", DEFAULT_CACHE), key[:16])
    if os.path.isfile(os.path.join(cache_dir, "tokenizer_config.json")):
        try:
            return AutoTokenizer.from_pretrained(cache_dir)
        except Exception:  # a stale or partial cache: rebuild it below
            pass
    tokenizer = AutoTokenizer.from_pretrained(path, gguf_file=gguf_file)
    try:
        tokenizer.save_pretrained(cache_dir)
    except OSError:
        pass  # a read-only home only costs the cache
    return tokenizer


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
        self.token_ids: list[int] = list(prompt_token_ids or [])
        # Start the window a few tokens back into the prompt so the first word's spacing is right.
        self.read_offset = len(self.token_ids)
        self.prefix_offset = max(self.read_offset - 5, 0)
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
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
