"""Tool calling: offering tools to a chat model and reading its calls back.

- ``requests``: checking ``tools``, ``tool_choice`` and the tool parts of messages;
- ``rendering``: the prompt, through the chat template (or Hermes form when it has no tools);
- ``grammar``: the JSON schema "required" and a named ``tool_choice`` force on the output;
- ``formats`` and ``stream``: the parsers (``hermes``, ``llama3_json``, ``mistral``,
  ``pythonic``) that split output into content and calls, whole or as it streams.

``ToolRequest`` ties them together for one request (used by ``LLM.chat`` and the server).
"""

from __future__ import annotations

import dataclasses

from jaxgen.structured_outputs import StructuredOutputsParams
from jaxgen.tool_calling.calls import ToolCall
from jaxgen.tool_calling.formats import TOOL_CALL_PARSERS, detect_parser, get_format
from jaxgen.tool_calling.grammar import tool_choice_constraint, tool_choice_schema
from jaxgen.tool_calling.rendering import (
    chat_template_of,
    render_chat,
    template_supports_tools,
)
from jaxgen.tool_calling.requests import (
    ToolChoice,
    ToolError,
    check_conversation,
    check_message_tool_fields,
    check_tool_choice,
    check_tools,
    lenient_tools,
)
from jaxgen.tool_calling.stream import ToolCallStream, Update, parse_tool_calls


def resolve_parser(configured: str | None, chat_template: str | None) -> str:
    """The parser to use: ``configured`` unless None or "auto", else the one the template's
    tool format calls for ("hermes" for a template without tools: see ``rendering``)."""
    if configured not in (None, "auto"):
        get_format(configured)  # raises ValueError for an unknown name
        return configured
    if template_supports_tools(chat_template):
        return detect_parser(chat_template)
    return "hermes"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolRequest:
    """One chat request's tools, its ``tool_choice`` and how its output is read."""

    tools: list[dict] | None
    choice: ToolChoice
    parser: str
    lenient: frozenset[str] = frozenset()  # tools whose ``function.strict`` is false

    @classmethod
    def build(
        cls,
        tools,
        tool_choice=None,
        *,
        parallel_tool_calls=None,
        tool_call_parser: str | None = None,
        chat_template: str | None = None,
    ) -> ToolRequest:
        """Checks the request's tool fields (``ToolError`` names a bad one)."""
        checked = check_tools(tools)
        choice = check_tool_choice(tool_choice, checked, parallel=parallel_tool_calls)
        return cls(
            tools=checked,
            choice=choice,
            parser=resolve_parser(tool_call_parser, chat_template),
            lenient=lenient_tools(tools),
        )

    @property
    def parses_output(self) -> bool:
        """Whether the output is read for calls (not for "none")."""
        return self.choice.mode != "none"

    @property
    def constraint(self) -> StructuredOutputsParams | None:
        """The ``structured_outputs`` "required" or a named function needs, else None."""
        return tool_choice_constraint(self.tools, self.choice, self.lenient)

    @property
    def needs_special_tokens(self) -> bool:
        """Whether the auto parser's markers are special tokens the text must keep."""
        return self.choice.mode == "auto" and get_format(self.parser).needs_special_tokens

    def stream(self) -> ToolCallStream:
        """A splitter for one completion's output."""
        return ToolCallStream(
            self.choice.mode,
            parser=self.parser,
            tool_name=self.choice.name,
            max_calls=None if self.choice.parallel else 1,
        )

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """A whole output as ``(content, tool_calls)``; without parsing, ``(text, [])``."""
        if not self.parses_output:
            return text, []
        stream = self.stream()
        stream.feed(text)
        stream.finish()
        return stream.content, stream.calls


__all__ = [
    "TOOL_CALL_PARSERS",
    "ToolCall",
    "ToolCallStream",
    "ToolChoice",
    "ToolError",
    "ToolRequest",
    "Update",
    "chat_template_of",
    "check_conversation",
    "check_message_tool_fields",
    "check_tool_choice",
    "check_tools",
    "detect_parser",
    "parse_tool_calls",
    "render_chat",
    "resolve_parser",
    "tool_choice_schema",
]
