"""Checking what a chat request says about tools: ``tools``, ``tool_choice`` and the tool parts of
its messages (assistant ``tool_calls``, ``tool`` results). Bad input raises ``ToolError``, a
``ValueError`` that names the offending field (``param``)."""

from __future__ import annotations

import dataclasses
import json
import re

NAME_PATTERN = re.compile(r"[A-Za-z0-9_.\-]{1,64}")  # OpenAI: a-z, A-Z, 0-9, _ and -, <= 64
CHOICES = ("none", "auto", "required")


class ToolError(ValueError):
    """A malformed tool field; ``param`` is its path (``tools[0].function.name``)."""

    def __init__(self, param: str, what: str, value=None):
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        super().__init__(f"`{param}` {what}, got {shown}")
        self.param = param


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolChoice:
    """``tool_choice`` checked: mode "none", "auto", "required" or "named" (with ``name``)."""

    mode: str
    name: str | None = None
    parallel: bool = True  # ``parallel_tool_calls``: False keeps one call


def check_tools(tools, param: str = "tools") -> list[dict] | None:
    """``tools`` as OpenAI function tools (``{"type": "function", "function": {"name",
    "description"?, "parameters"?}}``); None or [] gives None."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise ToolError(param, "must be a list of tools", tools)
    checked, names = [], set()
    for i, tool in enumerate(tools):
        where = f"{param}[{i}]"
        if not isinstance(tool, dict):
            raise ToolError(where, "must be an object", tool)
        if tool.get("type", "function") != "function":
            raise ToolError(f"{where}.type", "must be 'function'", tool.get("type"))
        function = tool.get("function")
        if not isinstance(function, dict):
            raise ToolError(f"{where}.function", "must be an object", function)
        name = function.get("name")
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise ToolError(
                f"{where}.function.name",
                "must be 1-64 letters, digits, underscores, dots or dashes",
                name,
            )
        if name in names:
            raise ToolError(f"{where}.function.name", "repeats another tool's name", name)
        names.add(name)
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise ToolError(f"{where}.function.description", "must be a string", description)
        parameters = function.get("parameters")
        if parameters is not None:
            check_parameters(parameters, f"{where}.function.parameters")
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ToolError(f"{where}.function.strict", "must be a boolean", strict)
        entry = {"name": name}
        if description is not None:
            entry["description"] = description
        entry["parameters"] = parameters if parameters else empty_parameters()
        checked.append({"type": "function", "function": entry})
    return checked


def lenient_tools(tools) -> frozenset[str]:
    """The names of the (checked) ``tools`` whose ``function.strict`` is false: their arguments
    get JSON Schema's lenient reading when constrained."""
    return frozenset(
        tool["function"]["name"]
        for tool in tools or []
        if isinstance(tool, dict)
        and isinstance(tool.get("function"), dict)
        and tool["function"].get("strict") is False
    )


def empty_parameters() -> dict:
    """The schema of a function whose ``parameters`` are omitted or ``{}``: no arguments (as
    OpenAI reads it), so a constrained call writes ``{}``."""
    return {"type": "object", "properties": {}, "additionalProperties": False}


def check_parameters(parameters, param: str) -> None:
    """A function's ``parameters``: a JSON Schema for an object (``{}`` means no arguments)."""
    if not isinstance(parameters, dict):
        raise ToolError(param, "must be a JSON Schema object", parameters)
    if parameters and parameters.get("type") != "object":
        raise ToolError(
            f"{param}.type",
            "must be 'object' (arguments are a JSON object)",
            parameters.get("type"),
        )
    properties = parameters.get("properties")
    if properties is not None and not (
        isinstance(properties, dict) and all(isinstance(v, dict) for v in properties.values())
    ):
        raise ToolError(f"{param}.properties", "must map names to schemas", properties)
    required = parameters.get("required")
    if required is not None and not (
        isinstance(required, list) and all(isinstance(r, str) for r in required)
    ):
        raise ToolError(f"{param}.required", "must be a list of property names", required)


def check_tool_choice(
    choice, tools: list[dict] | None, *, parallel=None, param: str = "tool_choice"
) -> ToolChoice:
    """``tool_choice`` against the checked ``tools``; default "auto" with tools, else "none"."""
    if parallel is not None and not isinstance(parallel, bool):
        raise ToolError("parallel_tool_calls", "must be a boolean", parallel)
    parallel = True if parallel is None else parallel
    if choice is None:
        return ToolChoice(mode="auto" if tools else "none", parallel=parallel)
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise ToolError(
                param, f"must be one of {', '.join(CHOICES)} or a named function", choice
            )
        if choice != "none" and not tools:
            raise ToolError(param, "needs `tools`", choice)
        return ToolChoice(mode=choice, parallel=parallel)
    if not isinstance(choice, dict) or choice.get("type") != "function":
        raise ToolError(
            param, 'must be a string or {"type": "function", "function": {"name"}}', choice
        )
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise ToolError(f"{param}.function.name", "must be a string", name)
    if not tools:
        raise ToolError(param, "needs `tools`", choice)
    if name not in {t["function"]["name"] for t in tools}:
        raise ToolError(f"{param}.function.name", "names no tool in `tools`", name)
    return ToolChoice(mode="named", name=name, parallel=parallel)


def check_message_tool_fields(message: dict, role: str, param: str) -> dict:
    """The tool fields of one checked message: ``tool_calls`` (assistant), ``tool_call_id`` and
    ``name`` (tool). Returns the fields to keep; raises ``ToolError`` on bad ones."""
    fields = {}
    if role == "assistant" and message.get("tool_calls") is not None:
        calls = message["tool_calls"]
        if not isinstance(calls, list):
            raise ToolError(f"{param}.tool_calls", "must be a list", calls)
        fields["tool_calls"] = [
            _check_call(call, f"{param}.tool_calls[{j}]") for j, call in enumerate(calls)
        ]
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise ToolError(f"{param}.tool_call_id", "must be a non-empty string", call_id)
        fields["tool_call_id"] = call_id
        name = message.get("name")
        if name is not None:
            if not isinstance(name, str):
                raise ToolError(f"{param}.name", "must be a string", name)
            fields["name"] = name
    return fields


def _check_call(call, param: str) -> dict:
    if not isinstance(call, dict):
        raise ToolError(param, "must be an object", call)
    if call.get("type", "function") != "function":
        raise ToolError(f"{param}.type", "must be 'function'", call.get("type"))
    call_id = call.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise ToolError(f"{param}.id", "must be a string", call_id)
    function = call.get("function")
    if not isinstance(function, dict):
        raise ToolError(f"{param}.function", "must be an object", function)
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ToolError(f"{param}.function.name", "must be a non-empty string", name)
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, dict):
        arguments = json.dumps(arguments, ensure_ascii=False)
    if not isinstance(arguments, str):
        raise ToolError(f"{param}.function.arguments", "must be a JSON string", arguments)
    checked = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id is not None:
        checked["id"] = call_id
    return checked


def check_conversation(messages: list[dict], param: str = "messages") -> list[dict]:
    """The offline API's messages (dicts with ``role`` and ``content``) with their tool fields
    checked; other keys are kept as given."""
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ToolError(f"{param}[{i}]", "must be a message object", message)
        role = message.get("role")
        tool_fields = check_message_tool_fields(message, role, f"{param}[{i}]")
        checked.append({**message, **tool_fields})
    return checked
