"""OpenAI Responses request bodies (``POST /v1/responses``), checked and read as the chat
request they amount to, so they share the chat path: the template, tools, grammar, sampling.

``input`` (a string, or a list of messages, ``reasoning`` items (the next assistant turn's
``reasoning_content`` for the template) and ``function_call`` / ``function_call_output`` items)
and ``instructions`` become ``messages``; flat function ``tools`` and ``tool_choice`` their chat
forms; ``text.format`` becomes ``response_format``; ``max_output_tokens``
``max_completion_tokens``; ``top_logprobs`` (or ``include`` of
``message.output_text.logprobs``) chat's ``logprobs``. A chat error's ``param`` is renamed back
to the Responses field. ``previous_response_id`` continues a stored response: the route looks it
up and passes its conversation as ``history``, which the new input follows (its
``instructions`` are not carried over, as OpenAI's).
"""

from __future__ import annotations

import dataclasses
import re

from serving.openai.requests import OpenAIRequest, parse_chat
from serving.sampling_fields import PLAIN_NAMES
from serving.validation import Fields, RequestError

MESSAGE_ROLES = ("user", "assistant", "system", "developer")
MAX_TOP_LOGPROBS = 20
LOGPROBS_INCLUDE = "message.output_text.logprobs"
# ``include`` values taken: the logprobs, and ones naming what jaxgen never outputs (encrypted
# reasoning: its reasoning items carry their text; tool results): nothing to include.
INCLUDES = (
    LOGPROBS_INCLUDE,
    "reasoning.encrypted_content",
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
)
TEXT_PARTS = ("input_text", "output_text", "text")
# Fields passed on as they are: the plain sampling fields (vLLM's extras included) and these.
PASSED_FIELDS = (
    "model",
    "stream",
    "parallel_tool_calls",
    "user",
    "seed",
    "priority",
    *PLAIN_NAMES,
)
RENAMED = [  # chat param (prefix) -> Responses param
    (re.compile(r"^messages(\[\d+\])?.*"), "input"),
    (re.compile(r"^max_completion_tokens$"), "max_output_tokens"),
    (re.compile(r"^max_tokens$"), "max_output_tokens"),
    (re.compile(r"^response_format\.json_schema\.schema$"), "text.format.schema"),
    (re.compile(r"^response_format.*"), "text.format"),
    (re.compile(r"^tool_choice\.function\.name$"), "tool_choice.name"),
]
TOOL_PARAM = re.compile(r"^tools\[(\d+)\]\.function\.(.*)$")


@dataclasses.dataclass
class ResponsesRequest:
    """A checked Responses request: the chat request it runs as, and what the response
    object repeats."""

    chat: OpenAIRequest
    instructions: str | None
    max_output_tokens: int | None
    temperature: float
    top_p: float
    tools: list[dict]
    tool_choice: object
    parallel_tool_calls: bool
    text_format: dict
    metadata: dict | None
    user: str | None
    messages: list[dict]  # the conversation it runs on, without ``instructions``
    store: bool = True
    background: bool = False
    previous_response_id: str | None = None
    top_logprobs: int = 0

    @property
    def stream(self) -> bool:
        return self.chat.stream


def parse_responses(state, body: dict, history: list[dict] | None = None) -> ResponsesRequest:
    """Checks a Responses body (``RequestError`` naming its field) and parses it as chat, its
    input following ``history`` (the conversation of ``previous_response_id``)."""
    fields = Fields(body)
    if fields.data.get("conversation") is not None:
        raise fields.error("conversation", "is not supported: use `previous_response_id`")
    fields.unsupported("prompt")
    store = fields.boolean("store", True)
    background = fields.boolean("background", False)
    previous_response_id = fields.string("previous_response_id")
    instructions = fields.string("instructions")
    metadata = fields.data.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise fields.error("metadata", "must be an object")
    truncation = fields.data.get("truncation")
    if truncation not in (None, "disabled", "auto"):
        raise fields.error("truncation", "must be 'auto' or 'disabled'")
    reasoning = fields.data.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise fields.error("reasoning", "must be an object")
    top_logprobs = fields.integer("top_logprobs", 0, minimum=0, maximum=MAX_TOP_LOGPROBS)
    include = fields.string_list("include", max_items=len(INCLUDES), allow_single=False)
    for i, value in enumerate(include):
        if value not in INCLUDES:
            raise fields.error(f"include[{i}]", f"must be one of {', '.join(INCLUDES)}")
    messages = list(history or []) + input_messages(fields)
    chat = {key: body[key] for key in PASSED_FIELDS if key in body}
    chat["messages"] = messages
    if instructions:
        chat["messages"] = [{"role": "system", "content": instructions}, *messages]
    if top_logprobs or LOGPROBS_INCLUDE in include:
        chat["logprobs"] = True
        chat["top_logprobs"] = top_logprobs
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    tools = function_tools(fields)
    if tools:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = chat_tool_choice(fields)
    text_format = text_format_of(fields)
    if text_format["type"] != "text":
        chat["response_format"] = response_format(text_format)
    try:
        parsed = parse_chat(state, chat)
    except RequestError as error:
        raise renamed(error) from None
    params = parsed.params[0]
    return ResponsesRequest(
        chat=parsed,
        instructions=instructions,
        max_output_tokens=body.get("max_output_tokens"),
        temperature=params.temperature,
        top_p=params.top_p,
        tools=body.get("tools") or [],
        tool_choice=body.get("tool_choice") or ("auto" if tools else "none"),
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
        text_format=text_format,
        metadata=metadata,
        user=body.get("user"),
        messages=messages,
        store=store,
        background=background,
        previous_response_id=previous_response_id,
        top_logprobs=top_logprobs,
    )


def renamed(error: RequestError) -> RequestError:
    """``error`` with its chat ``param`` named as the Responses field it came from."""
    param = error.param
    if param is None:
        return error
    new = param
    match = TOOL_PARAM.match(param)
    if match:
        new = f"tools[{match[1]}].{match[2]}"
    else:
        for pattern, name in RENAMED:
            if pattern.match(param):
                new = name
                break
    if new == param:
        return error
    message = error.message.replace(f"`{param}`", f"`{new}`")
    return RequestError(message, param=new, kind=error.kind)


def input_messages(fields: Fields) -> list[dict]:
    """``input`` as chat messages: a string is one user message; a list holds messages
    (``content`` a string or text parts), ``function_call`` and ``function_call_output``
    items."""
    value = fields.data.get("input")
    if isinstance(value, str):
        if not value:
            raise fields.error("input", "must not be empty")
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise fields.error("input", "must be a string or a non-empty list of input items")
    messages: list[dict] = []
    reasoning = None  # a reasoning item's text, for the assistant turn that follows it
    for i, raw in enumerate(value):
        item = Fields(raw, f"input[{i}]")
        kind = item.data.get("type", "message")
        if kind == "reasoning":
            reasoning = reasoning_text(item)
            continue
        if kind == "message":
            messages.append(input_message(item))
        elif kind == "function_call":
            call = {
                "id": item.string("call_id") or item.string("id") or f"call_{i}",
                "type": "function",
                "function": {"name": item.string("name"), "arguments": item.string("arguments")},
            }
            if call["function"]["name"] is None:
                raise item.error("name", "is required")
            if call["function"]["arguments"] is None:
                raise item.error("arguments", "is required (a JSON object's text)")
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.string("call_id")
            if not call_id:
                raise item.error("call_id", "is required")
            output = item.data.get("output")
            if not isinstance(output, str):
                output = text_of(Fields({"content": output}, f"input[{i}]"), "output")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        else:
            raise item.error(
                "type",
                "must be 'message', 'reasoning', 'function_call' or 'function_call_output'",
            )
        if reasoning is not None and messages[-1]["role"] == "assistant":
            messages[-1]["reasoning_content"] = reasoning  # the template reads it
        reasoning = None
    return messages


def output_messages(output: list[dict]) -> list[dict]:
    """A response's ``output`` items as the chat messages a conversation continues from (they
    are input items: messages of ``output_text`` parts, ``function_call`` items)."""
    return input_messages(Fields({"input": output}, "previous_response_id")) if output else []


def reasoning_text(item: Fields) -> str:
    """A ``reasoning`` input item's text: its ``content`` (``reasoning_text`` parts), else its
    ``summary`` (``summary_text`` parts)."""
    for key, part_type in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.data.get(key)
        if parts is None:
            continue
        if not isinstance(parts, list):
            raise item.error(key, f"must be a list of {part_type} parts")
        texts = []
        for j, part in enumerate(parts):
            part_fields = Fields(part, f"{item.name(key)}[{j}]")
            if part_fields.data.get("type") != part_type:
                raise part_fields.error("type", f"must be '{part_type}'")
            texts.append(part_fields.string("text", ""))
        if texts:
            return "\n".join(texts)
    return ""


def input_message(item: Fields) -> dict:
    role = item.string("role")
    if role not in MESSAGE_ROLES:
        raise item.error("role", f"must be one of {', '.join(MESSAGE_ROLES)}")
    return {"role": role, "content": text_of(item, "content")}


def text_of(item: Fields, key: str) -> str:
    """A string, or a list of text parts (``input_text``, ``output_text``) joined."""
    content = item.data.get(key if key in item.data else "content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise item.error(key, "must be a string or a list of text parts")
    parts = []
    for j, part in enumerate(content):
        part_fields = Fields(part, f"{item.name(key)}[{j}]")
        if part_fields.data.get("type") not in TEXT_PARTS:
            raise part_fields.error(
                "type", "must be 'input_text' or 'output_text' (other content is not supported)"
            )
        parts.append(part_fields.string("text", ""))
    return "".join(parts)


def function_tools(fields: Fields) -> list[dict]:
    """Responses' flat function tools (``{"type": "function", "name", "parameters"...}``) in
    chat form."""
    tools = fields.data.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise fields.error("tools", "must be a list of tools")
    converted = []
    for i, raw in enumerate(tools):
        tool = Fields(raw, f"tools[{i}]")
        if tool.data.get("type") != "function":
            raise tool.error("type", "must be 'function' (other tools are not supported)")
        keys = ("name", "description", "parameters", "strict")
        function = {key: tool.data[key] for key in keys if key in tool.data}
        converted.append({"type": "function", "function": function})
    return converted


def chat_tool_choice(fields: Fields):
    choice = fields.data.get("tool_choice")
    if isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise fields.error(
        "tool_choice", "must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}"
    )


def text_format_of(fields: Fields) -> dict:
    text = Fields(fields.data.get("text"), "text")
    value = text.data.get("format")
    if value is None:
        return {"type": "text"}
    format_fields = Fields(value, "text.format")
    kind = format_fields.data.get("type")
    if kind not in ("text", "json_object", "json_schema"):
        raise format_fields.error("type", "must be 'text', 'json_object' or 'json_schema'")
    if kind == "json_schema":
        format_fields.string("name")
        if not isinstance(format_fields.data.get("schema"), dict):
            raise format_fields.error("schema", "must be a JSON Schema object")
    return dict(value)


def response_format(text_format: dict) -> dict:
    if text_format["type"] == "json_object":
        return {"type": "json_object"}
    spec = {"name": text_format.get("name") or "response", "schema": text_format["schema"]}
    if text_format.get("strict") is not None:
        spec["strict"] = text_format["strict"]
    return {"type": "json_schema", "json_schema": spec}
