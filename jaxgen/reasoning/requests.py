"""One chat request's reasoning: its format, where its output starts, and what that means for
its sampling parameters and its output (used by ``LLM.chat`` and the server)."""

from __future__ import annotations

import dataclasses

from jaxgen.reasoning.formats import (
    IN_REASONING,
    NO_REASONING,
    ReasoningFormat,
    get_reasoning_format,
)
from jaxgen.reasoning.grammar_gate import ReasoningSpan
from jaxgen.reasoning.stream import ReasoningStream, reasoning_token_count


@dataclasses.dataclass(frozen=True)
class ReasoningRequest:
    """The reasoning of one prompt's output.

    Args:
        format: the ``ReasoningFormat`` (``--reasoning-parser``).
        state: where the output starts (``IN_REASONING``, ``MAY_OPEN`` or ``NO_REASONING``).
        special_tags: whether a tag is a special token (the output's text must keep them).
    """

    format: ReasoningFormat
    state: str
    special_tags: bool = False

    @classmethod
    def build(
        cls,
        parser: str | None,
        prompt: str,
        *,
        chat_template_kwargs: dict | None = None,
        tokenizer=None,
    ) -> ReasoningRequest | None:
        """The reasoning of ``prompt``'s output under ``parser`` (None: no parser, nothing is
        read). ``ValueError`` naming ``reasoning_parser`` for an unknown parser."""
        if parser is None:
            return None
        fmt = get_reasoning_format(parser)
        state = fmt.output_start(prompt, chat_template_kwargs)
        special = tokenizer is not None and any(
            is_special_token(tokenizer, tag) for tag in (fmt.start, fmt.end)
        )
        return cls(fmt, state, special)

    @property
    def expects_reasoning(self) -> bool:
        """Whether the output may hold reasoning (not when thinking is off, or the prompt
        closed it)."""
        return self.state != NO_REASONING

    @property
    def span(self) -> ReasoningSpan | None:
        """What a structured-output constraint waits out (None: it applies from the start)."""
        if not self.expects_reasoning:
            return None
        start = None if self.state == IN_REASONING else self.format.start
        return ReasoningSpan(end=self.format.end, start=start)

    def stream(self) -> ReasoningStream:
        """A splitter for one completion's output."""
        return ReasoningStream(self.format.start, self.format.end, self.state)

    def parse(self, text: str) -> tuple[str | None, str | None]:
        """A whole output as ``(reasoning, content)``."""
        stream = self.stream()
        stream.feed(text)
        stream.finish()
        return stream.reasoning, stream.content

    def count_tokens(self, token_texts: list[str]) -> int:
        """The reasoning tokens of an output given each token's text (``usage``'s
        ``reasoning_tokens``; a step's text may all sit on its last token)."""
        stream = self.stream()
        ends, position = [], 0
        for text in token_texts:
            stream.feed(text)
            position += len(text)
            ends.append(position)
        stream.finish()
        return reasoning_token_count(stream, ends)

    def constrain(self, params, *, keep_skip_special_tokens: bool = False):
        """``params`` (a ``SamplingParams``) with its constraint waiting out the reasoning, and
        special tokens kept in the text when a tag is one (unless
        ``keep_skip_special_tokens``: the caller chose). The same object when nothing
        changes."""
        changes = {}
        constraint = params.structured_outputs
        if constraint is not None and self.span is not None:
            changes["structured_outputs"] = dataclasses.replace(constraint, reasoning=self.span)
        if self.special_tags and self.expects_reasoning and not keep_skip_special_tokens:
            changes["skip_special_tokens"] = False
        return dataclasses.replace(params, **changes) if changes else params

    def fill(self, completion) -> str:
        """Sets a ``CompletionOutput``'s ``reasoning_content`` and ``content`` from its text;
        returns the content ("" when none) for the tool-call parser."""
        completion.reasoning_content, completion.content = self.parse(completion.text)
        return completion.content or ""


def is_special_token(tokenizer, text: str) -> bool:
    """Whether ``text`` is one special token of ``tokenizer`` (dropped from decoded text unless
    ``skip_special_tokens`` is off)."""
    try:
        ids = tokenizer.encode(text, add_special_tokens=False)
    except Exception:  # a tokenizer that cannot encode it: not one of its tokens
        return False
    special = set(getattr(tokenizer, "all_special_ids", None) or [])
    return len(ids) == 1 and ids[0] in special
