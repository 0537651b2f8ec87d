"""A structured-output grammar that starts where the reasoning ends.

With a reasoning model the constraint (a JSON schema, a regex, a tool call) is for the answer:
the thinking before it is free. ``ReasoningGate`` wraps a request's llguidance matcher and
offers the engine the same calls (``GrammarMasks`` and speculative drafts use): while the output
is inside the reasoning, every token is allowed and the matcher is fed nothing; once the end
tag has been generated, the matcher reads the tokens that follow. The tags are found in the
tokens' text, so an end tag that is one added token and one spelled over several tokens
(``</``, ``think``, ``>``) close the reasoning alike; text after the tag in the token that
completes it is fed to the grammar (re-tokenised; leading whitespace is not).

A span with a ``start`` tag (``MAY_OPEN``: Qwen3) is not inside the reasoning yet: the first
token may be the start tag (its added token when the tokenizer has one, else a token of its
first characters) or the grammar's. A token that begins the tag commits to it (the next ones
may only go on writing it, as the stream splitter reads it); any other token is the answer's,
and the grammar applies from it.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses

from jaxgen.reasoning.stream import partial_tag
from jaxgen.reasoning.token_texts import TokenTexts, token_texts

MAX_ROLLBACK = 64  # tokens a gate can take back (a speculative draft is at most 16)
# A gate's phases.
OPENING = "opening"  # the start tag may come first
THINKING = "thinking"  # inside the reasoning: every token allowed
ANSWER = "answer"  # the grammar reads the tokens


@dataclasses.dataclass(frozen=True)
class ReasoningSpan:
    """The reasoning a constraint waits out (``StructuredOutputsParams.reasoning``).

    Args:
        end: the tag that closes the reasoning; the constraint applies after it.
        start: the tag that opens it, when the output is not inside it yet: the output is
            reasoning only if it opens with ``start``, else the constraint applies from the
            first token. None: the output starts inside the reasoning.
    """

    end: str
    start: str | None = None

    def __post_init__(self):
        if not isinstance(self.end, str) or not self.end:
            raise ValueError(f"reasoning.end must be a non-empty string, got {self.end!r}")
        if self.start is not None and (not isinstance(self.start, str) or not self.start):
            raise ValueError(f"reasoning.start must be a non-empty string, got {self.start!r}")


class ReasoningGate:
    """``matcher`` (an ``llguidance.LLMatcher``) applied from the end of ``span``'s reasoning.

    Args:
        matcher: the request's own matcher (a copy of the compiled one).
        span: the ``ReasoningSpan``.
        texts: the tokenizer's ``TokenTexts``.
    """

    def __init__(self, matcher, span: ReasoningSpan, texts: TokenTexts):
        self.matcher = matcher
        self.span = span
        self.texts = texts
        self.phase = OPENING if span.start is not None else THINKING
        # OPENING: the start tag written so far; THINKING: a tail that may begin the end tag
        self.held = ""
        self.held_tokens: tuple[int, ...] = ()  # OPENING: the tokens of ``held``
        self.error_message = ""
        # (the gate's state before a token, tokens that token fed the matcher), newest last
        self._history: collections.deque = collections.deque(maxlen=MAX_ROLLBACK)

    # -- what the engine calls (llguidance.LLMatcher's names) -----------------------------------
    def deep_copy(self) -> ReasoningGate:
        copy = ReasoningGate(self.matcher.deep_copy(), self.span, self.texts)
        copy._restore(self._state())
        return copy

    def get_grammar_warnings(self) -> list[str]:
        return self.matcher.get_grammar_warnings()

    def is_error(self) -> bool:
        return bool(self.error_message) or (self.phase == ANSWER and self.matcher.is_error())

    def get_error(self) -> str:
        return self.error_message or self.matcher.get_error()

    def is_stopped(self) -> bool:
        """Whether nothing but EOS may follow (never inside the reasoning)."""
        return bool(self.error_message) or (self.phase == ANSWER and self.matcher.is_stopped())

    def unsafe_compute_mask_ptr(self, pointer: int, size: int) -> None:
        """The next token's mask into ``size`` bytes at ``pointer`` (bit j of word w: token
        32 w + j)."""
        if self.phase == ANSWER:
            self.matcher.unsafe_compute_mask_ptr(pointer, size)
            return
        if self.phase == THINKING:
            ctypes.memset(pointer, 0xFF, size)
            return
        if self.held:  # the start tag begun: only its next pieces
            ctypes.memset(pointer, 0, size)
        else:  # the grammar's first tokens, or the start tag's
            self.matcher.unsafe_compute_mask_ptr(pointer, size)
        words = (ctypes.c_uint32 * (size // 4)).from_address(pointer)
        for token, _ in self._next_pieces():
            if token < size * 8:
                words[token >> 5] |= 1 << (token & 31)

    def consume_token(self, token: int) -> bool:
        """Takes the token the sequence kept; False if the grammar refused it (the gate is then
        in error, as a matcher would be)."""
        before = self._state()
        ok, fed = self._advance(int(token))
        self._history.append((before, fed))
        return ok

    def validate_tokens(self, tokens: list[int]) -> int:
        """How many of ``tokens``, from the first, could be taken in turn."""
        if self.phase == ANSWER and not self.error_message:
            return self.matcher.validate_tokens(tokens)
        probe = self.deep_copy()
        for count, token in enumerate(tokens):
            if not probe.consume_token(token):
                return count
        return len(tokens)

    def rollback(self, num_tokens: int) -> bool:
        """Takes back the last ``num_tokens`` tokens (at most ``MAX_ROLLBACK``)."""
        if num_tokens > len(self._history):
            return False
        for _ in range(num_tokens):
            before, fed = self._history.pop()
            if fed:
                self.matcher.rollback(fed)
            self._restore(before)
        return True

    # -- the phases ------------------------------------------------------------------------------
    def _state(self) -> tuple:
        return self.phase, self.held, self.held_tokens, self.error_message

    def _restore(self, state: tuple) -> None:
        self.phase, self.held, self.held_tokens, self.error_message = state

    def _next_pieces(self) -> list[tuple[int, int]]:
        """The tokens that go on writing the start tag. At its first character: its own token
        when the tokenizer has one (an added token: how such a model writes it), else every
        token of its opening characters."""
        start = self.span.start
        pieces = self.texts.pieces(start).get(len(self.held), [])
        whole = [piece for piece in pieces if piece[1] == len(start)]
        return whole if not self.held and whole else pieces

    def _advance(self, token: int) -> tuple[bool, int]:
        """Takes one token: ``(accepted, tokens fed to the matcher)``."""
        if self.error_message:
            return False, 0
        if self.phase == ANSWER:
            ok = self.matcher.consume_token(token)
            return ok, int(ok)
        text = self.texts.text(token)
        if self.phase == THINKING:
            return self._thinking(text)
        start = self.span.start
        written = self.held + text
        if written.startswith(start):  # the tag is written: the reasoning begins
            self.phase, self.held, self.held_tokens = THINKING, "", ()
            return self._thinking(written[len(start) :])
        if text and start.startswith(written):
            self.held, self.held_tokens = written, (*self.held_tokens, token)
            return True, 0
        tokens = (*self.held_tokens, token)  # not the tag: the answer, from its first token
        self.phase, self.held, self.held_tokens = ANSWER, "", ()
        return self._feed(tokens, "the output's first tokens")

    def _thinking(self, text: str) -> tuple[bool, int]:
        end = self.span.end
        written = self.held + text
        found = written.find(end)
        if found < 0:
            self.held = written[len(written) - partial_tag(written, 0, end) :]
            return True, 0
        self.phase, self.held = ANSWER, ""
        rest = written[found + len(end) :].lstrip()
        if not rest:
            return True, 0
        return self._feed(tuple(self.texts.encode(rest)), f"the text after {end!r}")

    def _feed(self, tokens: tuple[int, ...], what: str) -> tuple[bool, int]:
        for count, token in enumerate(tokens):
            if not self.matcher.consume_token(token):
                error = self.matcher.get_error() or "refused"
                self.error_message = f"{what} do not fit the grammar: {error}"[:300]
                return False, count
        return True, len(tokens)


def gate_grammar(matcher, span: ReasoningSpan | None, tokenizer):
    """``matcher`` applied after ``span``'s reasoning (a ``ReasoningGate`` over the tokens of
    ``tokenizer``); ``matcher`` itself when there is no span."""
    if span is None or matcher is None:
        return matcher
    return ReasoningGate(matcher, span, token_texts(tokenizer))
