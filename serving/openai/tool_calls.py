"""Tool calling on ``/v1/chat/completions``: the request's tool fields, the prompt, and the
assistant messages and stream deltas that carry ``tool_calls``.

The checking, rendering and parsing live in ``jaxgen.tool_calling`` (shared with ``LLM.chat``);
this module turns its ``ToolError`` into OpenAI's 400 and shapes the responses. Streamed calls are
whole-call deltas (``{"index", "id", "type", "function": {"name", "arguments"}}`` once a call is
complete), except for a named ``tool_choice``, whose arguments stream as they are generated.
"""

from __future__ import annotations

import dataclasses

from jaxgen.tool_calling import (
    ToolError,
    ToolRequest,
    chat_template_of,
    check_message_tool_fields,
    render_chat,
)
from serving.validation import Fields, RequestError


def tool_request(state, fields: Fields) -> ToolRequest:
    """The request's ``tools``, ``tool_choice`` and ``parallel_tool_calls``, checked."""
    template = chat_template_of(state.llm.tokenizer)
    try:
        return ToolRequest.build(
            fields.data.get("tools"),
            fields.data.get("tool_choice"),
            parallel_tool_calls=fields.data.get("parallel_tool_calls"),
            tool_call_parser=state.settings.tool_call_parser,
            chat_template=template,
        )
    except ToolError as error:
        raise RequestError(str(error), param=error.param) from None


def message_tool_fields(message: dict, role: str, param: str) -> dict:
    """A message's ``tool_calls`` / ``tool_call_id`` / ``name``, checked (400 naming the field)."""
    try:
        return check_message_tool_fields(message, role, param)
    except ToolError as error:
        raise RequestError(str(error), param=error.param) from None


def render_prompt(state, messages: list[dict], tools: ToolRequest, options):
    """The prompt text: the conversation and the offered tools through the chat template
    (``options``: the request's ``ChatTemplateOptions``)."""
    try:
        return render_chat(state.llm.tokenizer, messages, tools=tools.tools, options=options)
    except Exception as error:  # the template refused the conversation
        raise RequestError(
            f"`messages` do not fit the chat template: {error}"[:500], param="messages"
        ) from None


def constrain(params: list, tools: ToolRequest, body: dict) -> list:
    """Sampling parameters with the grammar "required" or a named ``tool_choice`` needs, and
    special tokens kept in the text when the auto parser's markers are special tokens."""
    constraint = tools.constraint
    changed = []
    for p in params:
        if constraint is not None:
            if p.structured_outputs is not None:
                raise RequestError(
                    "`tool_choice` 'required' or a named function cannot be combined with "
                    "another output constraint (`response_format`, `structured_outputs`)",
                    param="tool_choice",
                )
            p = dataclasses.replace(p, structured_outputs=constraint)
        if tools.needs_special_tokens and body.get("skip_special_tokens") is None:
            p = dataclasses.replace(p, skip_special_tokens=False)
        changed.append(p)
    return changed


def constraint_param(tools) -> str | None:
    """The field a tool constraint's schema came from (a grammar llguidance refuses is a 400
    naming it): the named tool's ``parameters``, or ``tools`` for "required"; None without one."""
    if tools is None or tools.constraint is None:
        return None
    if tools.choice.mode == "named":
        names = [tool["function"]["name"] for tool in tools.tools]
        return f"tools[{names.index(tools.choice.name)}].function.parameters"
    return "tools"


def finish_reason(reason: str | None, calls: list) -> str | None:
    """A completion that ended normally with calls ends with "tool_calls"."""
    return "tool_calls" if calls and reason == "stop" else reason


def tool_message(tools: ToolRequest, text: str, reason: str | None) -> tuple[dict, str | None]:
    """The assistant message of a whole output, and its finish reason."""
    content, calls = tools.parse(text)
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [call.to_openai() for call in calls]
    return message, finish_reason(reason, calls)


class ToolDeltas:
    """Per-choice splitters for a streamed response."""

    def __init__(self, tools: ToolRequest):
        self.tools = tools
        self.streams: dict[int, object] = {}

    def delta(self, choice: int, text: str, reason: str | None) -> tuple[dict, str | None]:
        """The ``delta`` for one choice's new text (and its finish reason, if it ended)."""
        stream = self.streams.get(choice)
        if stream is None:
            stream = self.streams[choice] = self.tools.stream()
        update = stream.feed(text)
        if reason is not None:
            end = stream.finish()
            update.content += end.content
            update.tool_call_deltas += end.tool_call_deltas
        delta = {}
        if update.content:
            delta["content"] = update.content
        if update.tool_call_deltas:
            delta["tool_calls"] = update.tool_call_deltas
        return delta, finish_reason(reason, stream.calls) if reason else None
