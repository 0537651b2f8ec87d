"""Splitting a model's output into its reasoning and its answer (content), incrementally.

``ReasoningStream`` takes the output's text as it grows and returns what can be sent on: the
reasoning up to the end tag, the content after it. Text that could still be the start of a
tag is held back until the next piece (or ``finish()``) settles it, so a tag split across
tokens or steps is cut where it stands. A whole output goes through the same code
(``split_reasoning``), so a stream's pieces always add up to the non-streamed answer.

Where the output starts (``jaxgen.reasoning.formats``):

- ``IN_REASONING``: reasoning until the end tag, then content. A start tag the model writes at
  the very start (after any whitespace) is dropped with that whitespace;
- ``MAY_OPEN``: reasoning only if the output opens with the start tag (its first characters),
  else all content;
- ``NO_REASONING``: all content.

Without an end tag the reasoning runs to the end of the output and the content is None (the
output was cut by ``max_tokens`` or a stop before it answered).
"""

from __future__ import annotations

import dataclasses

from jaxgen.reasoning.formats import IN_REASONING, MAY_OPEN, NO_REASONING


@dataclasses.dataclass
class Split:
    """What one piece of output added to the reasoning and to the content."""

    reasoning: str = ""
    content: str = ""


class ReasoningStream:
    """One completion's output, split as it grows.

    Args:
        start: the start tag.
        end: the end tag.
        state: where the output starts: ``IN_REASONING``, ``MAY_OPEN`` or ``NO_REASONING``.
    """

    def __init__(self, start: str, end: str, state: str):
        if state not in (IN_REASONING, MAY_OPEN, NO_REASONING):
            raise ValueError(f"state must be {IN_REASONING!r}, {MAY_OPEN!r} or {NO_REASONING!r}")
        self.start, self.end = start, end
        self.state = state
        self.text = ""
        self.reasoning_parts: list[str] = []
        self.content_parts: list[str] = []
        # Offsets in ``text``: where the reasoning starts (None: no reasoning) and where its
        # end tag starts (None: not written).
        self.reasoning_start: int | None = 0 if state == IN_REASONING else None
        self.reasoning_end: int | None = None
        self._pos = 0  # text before this is sent or dropped
        self._fresh = state != NO_REASONING  # at the output's start: a start tag may come

    # -- public --------------------------------------------------------------------------------
    def feed(self, delta: str) -> Split:
        """Adds ``delta`` to the output; returns what can be sent now."""
        self.text += delta
        split = Split()
        self._scan(split, final=False)
        return split

    def finish(self) -> Split:
        """The output ended: sends what was held back (a partial tag is text after all)."""
        split = Split()
        self._scan(split, final=True)
        return split

    @property
    def reasoning(self) -> str | None:
        """The reasoning (None when there is none)."""
        return "".join(self.reasoning_parts) or None

    @property
    def content(self) -> str | None:
        """The answer (None when there is none: the output ended inside the reasoning)."""
        return "".join(self.content_parts) or None

    @property
    def ended(self) -> bool:
        """Whether the reasoning's end tag was written."""
        return self.reasoning_end is not None

    # -- scanning ------------------------------------------------------------------------------
    def _scan(self, split: Split, final: bool) -> None:
        text = self.text
        while self._pos < len(text) or (final and self._fresh):
            rest = text[self._pos :]
            if self.state == NO_REASONING:
                self._content(rest, split)
                self._pos = len(text)
                return
            if self._fresh:
                # MAY_OPEN: the tag must be the output's first characters; IN_REASONING: a tag
                # the model writes itself may follow whitespace.
                lead = rest if self.state == MAY_OPEN else rest.lstrip()
                if lead.startswith(self.start):
                    self._pos = len(text) - len(lead) + len(self.start)
                    self.state, self._fresh = IN_REASONING, False
                    self.reasoning_start = self._pos
                    continue
                if not final and self.start.startswith(lead):  # may still become the tag
                    return
                self._fresh = False
                if self.state == MAY_OPEN:
                    self.state = NO_REASONING
                continue
            found = text.find(self.end, self._pos)
            if found >= 0:
                self._reasoning(text[self._pos : found], split)
                self.reasoning_end = found
                self._pos = found + len(self.end)
                self.state = NO_REASONING
                continue
            keep = 0 if final else partial_tag(text, self._pos, self.end)
            self._reasoning(text[self._pos : len(text) - keep], split)
            self._pos = len(text) - keep
            return

    def _reasoning(self, text: str, split: Split) -> None:
        if text:
            self.reasoning_parts.append(text)
            split.reasoning += text

    def _content(self, text: str, split: Split) -> None:
        if text:
            self.content_parts.append(text)
            split.content += text


def partial_tag(text: str, start: int, tag: str) -> int:
    """How many characters at the end of ``text[start:]`` could begin ``tag``."""
    for size in range(min(len(tag) - 1, len(text) - start), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


def split_reasoning(text: str, start: str, end: str, state: str) -> tuple[str | None, str | None]:
    """A whole output as ``(reasoning, content)`` (see ``ReasoningStream``)."""
    stream = ReasoningStream(start, end, state)
    stream.feed(text)
    stream.finish()
    return stream.reasoning, stream.content


def reasoning_token_count(stream: ReasoningStream, token_ends: list[int]) -> int:
    """The tokens of a finished ``stream``'s reasoning, given where each token's text ends in
    the output (``token_ends``, non-decreasing): those ending inside the reasoning, after the
    start tag and before the end tag (the tags' own tokens are not counted, as vLLM)."""
    if stream.reasoning_start is None:
        return 0
    first = stream.reasoning_start
    last = len(stream.text) if stream.reasoning_end is None else stream.reasoning_end
    # Reasoning from the output's first character (no start tag written): every token up to
    # the end tag, an empty one at the very start too.
    return sum(1 for end in token_ends if (end > first or first == 0) and end <= last)
