"""Splitting a model's output into plain content and tool calls, incrementally.

``ToolCallStream`` takes the output's text as it grows and returns what can be sent on: content
that cannot be the start of a call (a possible partial marker is held back) and each call once it
is complete (whole-call deltas). ``finish()`` settles the end. A whole output goes through the same
code (``parse_tool_calls``), so a stream's pieces always add up to the non-streamed answer.
Output that does not read as calls is returned as plain content, never an error.
"""

from __future__ import annotations

import dataclasses
import json

from jaxgen.tool_calling.calls import ToolCall, new_call_id
from jaxgen.tool_calling.formats import ToolCallFormat, get_format


@dataclasses.dataclass
class Update:
    """What one piece of output added: content text and/or tool-call deltas (OpenAI shape)."""

    content: str = ""
    tool_call_deltas: list[dict] = dataclasses.field(default_factory=list)


class ToolCallStream:
    """One completion's output, split as it grows.

    Args:
        mode: "auto" (calls in ``parser``'s format, text around them), "required" (a JSON list of
            calls, as the grammar forces) or "named" (the whole output is the arguments of
            ``tool_name``, as the grammar forces).
        parser: the format's name for "auto" (see ``formats.TOOL_CALL_PARSERS``).
        tool_name: the function for "named".
        max_calls: calls kept (later ones are dropped); None keeps all.
    """

    def __init__(
        self,
        mode: str,
        *,
        parser: str | None = None,
        tool_name: str | None = None,
        max_calls: int | None = None,
    ):
        if mode not in ("auto", "required", "named"):
            raise ValueError(f"mode must be 'auto', 'required' or 'named', got {mode!r}")
        self.mode = mode
        self.tool_name = tool_name
        self.max_calls = max_calls
        self.format: ToolCallFormat | None = None
        if mode == "auto":
            self.format = get_format(parser or "hermes")
        elif mode == "required":
            self.format = get_format("required")
        self.text = ""
        self.calls: list[ToolCall] = []
        self.content_parts: list[str] = []
        self._pos = 0  # text before this is sent (as content or calls) or dropped
        self._section: int | None = None  # where the section being read starts
        self._section_calls = 0  # calls of that section already sent
        self._at_start = True  # nothing but whitespace seen (leading markers may still begin)
        self._malformed = False  # the rest of the output is plain content
        self._held_whitespace = ""  # whitespace after a call: sent only if content follows
        self._named_arguments: list[str] = []

    # -- public --------------------------------------------------------------------------------
    def feed(self, delta: str) -> Update:
        """Adds ``delta`` to the output; returns what can be sent now."""
        self.text += delta
        update = Update()
        if self.mode == "named":
            self._feed_named(delta, update)
        else:
            self._scan(update, final=False)
        return update

    def finish(self) -> Update:
        """The output ended: sends what was held back."""
        update = Update()
        if self.mode == "named":
            self._feed_named("", update, final=True)
        else:
            self._scan(update, final=True)
        return update

    @property
    def content(self) -> str | None:
        """The plain content (None when there are calls and no other text)."""
        text = "".join(self.content_parts)
        return None if self.calls and not text.strip() else text

    # -- named ---------------------------------------------------------------------------------
    def _feed_named(self, delta: str, update: Update, final: bool = False) -> None:
        if not self.calls and (delta or final):
            call = ToolCall(id=new_call_id(), name=self.tool_name, arguments="")
            self.calls.append(call)
            update.tool_call_deltas.append({"index": 0, **call.to_openai()})
        if delta:
            self._named_arguments.append(delta)
            update.tool_call_deltas.append({"index": 0, "function": {"arguments": delta}})
        if final:
            arguments = "".join(self._named_arguments)
            self.calls[0] = dataclasses.replace(self.calls[0], arguments=arguments)
            if not _parses(arguments):  # cut (max_tokens, a stop): text, never a broken call
                self.calls = []
                self.content_parts = [arguments]

    # -- auto and required ---------------------------------------------------------------------
    def _scan(self, update: Update, final: bool) -> None:
        text, fmt = self.text, self.format
        while True:
            if self._malformed:
                self._content(text[self._pos :], update)
                self._pos = len(text)
                break
            if self._section is not None:
                read = fmt.read(text, self._section, final)
                for call in read.calls[self._section_calls :]:
                    self._call(call, update)
                self._section_calls = len(read.calls)
                if read.status == "incomplete" and not final:
                    break
                self._section, self._section_calls = None, 0
                if read.status == "done":
                    self._pos = read.end
                else:  # malformed (or still incomplete at the end): the rest is content
                    self._pos = read.end
                    self._malformed = True
                continue
            if self._at_start:
                rest = text[self._pos :]
                stripped = rest.lstrip()
                offset = self._pos + len(rest) - len(stripped)
                if not stripped and not final:
                    break
                if any(stripped.startswith(m) for m in fmt.leading_markers):
                    self._at_start = False
                    self._section = offset
                    continue
                if not final and any(m.startswith(stripped) for m in fmt.leading_markers):
                    break
                self._at_start = False
            found = [(text.find(m, self._pos), m) for m in fmt.markers]
            found = [(i, m) for i, m in found if i >= 0]
            if found:
                start = min(found)[0]
                self._content(text[self._pos : start], update)
                self._section = self._pos = start
                continue
            end = len(text) if final else len(text) - _partial_marker(text, self._pos, fmt)
            self._content(text[self._pos : end], update)
            self._pos = end
            break
        if final:
            self._held_whitespace = ""

    def _content(self, text: str, update: Update) -> None:
        if not text:
            return
        if self.calls and not text.strip():  # whitespace between or after calls
            self._held_whitespace += text
            return
        text, self._held_whitespace = self._held_whitespace + text, ""
        self.content_parts.append(text)
        update.content += text

    def _call(self, parsed, update: Update) -> None:
        if self.max_calls is not None and len(self.calls) >= self.max_calls:
            return
        call = ToolCall(id=new_call_id(), name=parsed.name, arguments=parsed.arguments)
        update.tool_call_deltas.append({"index": len(self.calls), **call.to_openai()})
        self.calls.append(call)
        self._held_whitespace = ""


def _parses(arguments: str) -> bool:
    """Whether a named call's arguments are one whole JSON value."""
    try:
        json.loads(arguments)
    except ValueError:
        return False
    return True


def _partial_marker(text: str, start: int, fmt: ToolCallFormat) -> int:
    """How many characters at the end of ``text[start:]`` could begin a marker."""
    longest = 0
    for marker in fmt.markers:
        for size in range(min(len(marker) - 1, len(text) - start), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest


def parse_tool_calls(
    text: str, mode: str = "auto", *, parser: str | None = None, tool_name: str | None = None
) -> tuple[str | None, list[ToolCall]]:
    """A whole output as ``(content, tool_calls)`` (see ``ToolCallStream``)."""
    stream = ToolCallStream(mode, parser=parser, tool_name=tool_name)
    stream.feed(text)
    stream.finish()
    return stream.content, stream.calls
