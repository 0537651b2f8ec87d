"""An incremental detokenizer for streaming."""

from __future__ import annotations


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
