"""A parsed tool call and how one is read out of a decoded JSON object."""

from __future__ import annotations

import dataclasses
import json
import secrets


def new_call_id() -> str:
    """An OpenAI-style tool-call id: ``call_`` and 24 random hex digits."""
    return "call_" + secrets.token_hex(12)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One call the model made: the function's name and its arguments as JSON text."""

    id: str
    name: str
    arguments: str  # a JSON object, as text (OpenAI's ``function.arguments``)
    type: str = "function"

    def to_openai(self) -> dict:
        """OpenAI's ``tool_calls`` entry."""
        return {
            "id": self.id,
            "type": self.type,
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclasses.dataclass(frozen=True)
class ParsedCall:
    """A call read from model text, before it is given an id."""

    name: str
    arguments: str


def call_from_object(value, argument_keys: tuple[str, ...]) -> ParsedCall | None:
    """``{"name": str, <argument key>: object}`` as a call; None if ``value`` is not one.

    The arguments may be missing (no arguments), an object, or a JSON string holding an object
    (some models quote them); they are re-serialised compactly as JSON text.
    """
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return None
    arguments = next((value[k] for k in argument_keys if k in value), {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(name, json.dumps(arguments, ensure_ascii=False))


def call_from_json(text: str, argument_keys: tuple[str, ...]) -> ParsedCall | None:
    """``call_from_object`` of JSON text; None if it is not valid JSON."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return call_from_object(value, argument_keys)
