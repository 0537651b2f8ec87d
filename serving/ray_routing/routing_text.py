"""The text a request's prompt starts with, as the prefix router matches it.

Only generation routes have one (chat, completions, Responses, TGI's ``/generate``,
``/generate_stream``, ``/`` and ``/invocations``); any other request, or a body that is not a
JSON object, gives "" and is placed by load alone. The text begins with the model the request
names (an adapter has a cache of its own), then the conversation in order: each message's role
and text, so the next turn of a conversation starts with the text of this one. ``history`` is
where the conversation's last assistant message starts: the text before it is what the previous
turn of the same conversation sent (the router never sees replies, so a match of all of it
means "an earlier turn of this conversation went there", however long the reply was). It is
never validated here: the replica answers a bad body with its usual error.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

GENERATION_PATHS = frozenset(
    {
        "/",
        "/generate",
        "/generate_stream",
        "/invocations",
        "/v1/chat/completions",
        "/v1/chat/completions/batch",
        "/v1/completions",
        "/v1/responses",
    }
)
MAX_ROUTING_CHARS = 1 << 17  # prefixes past ~32k tokens are not told apart
MESSAGE_END = "\x1e"  # separators no prompt text is expected to hold
FIELD_END = "\x1f"


@dataclasses.dataclass(frozen=True)
class RoutingText:
    """A request's routing text, and where its last assistant message starts (0: none)."""

    text: str = ""
    history: int = 0


def routing_text(path: str, body: bytes) -> RoutingText:
    """The routing text of a request to ``path`` with JSON ``body`` (empty when none)."""
    if path not in GENERATION_PATHS or not body:
        return RoutingText()
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):
        return RoutingText()
    if not isinstance(request, dict):
        return RoutingText()
    head = _model(request)
    history = 0
    if "messages" in request:
        messages = request["messages"]
        if path.endswith("/batch") and isinstance(messages, list) and messages:
            messages = messages[0]  # a batch of conversations: the first one's
        conversation, history = _messages(messages)
    elif "prompt" in request:
        conversation = _prompt(request["prompt"])
    elif "input" in request:  # the Responses API
        head += _text(request.get("instructions")) + FIELD_END
        value = request["input"]
        conversation, history = _messages(value) if isinstance(value, list) else (_text(value), 0)
    else:
        conversation = _text(request.get("inputs"))
    text = (head + conversation)[:MAX_ROUTING_CHARS]
    return RoutingText(text, min(len(head) + history, len(text)) if history else 0)


def _model(request: dict) -> str:
    parameters = request.get("parameters")
    adapter = parameters.get("adapter_id") if isinstance(parameters, dict) else None
    return _text(request.get("model") or adapter) + FIELD_END


def _messages(messages: Any) -> tuple[str, int]:
    """The messages' text, and where the last assistant message starts in it (0: none)."""
    if not isinstance(messages, list):
        return "", 0
    parts, length, history = [], 0, 0
    for message in messages:
        if isinstance(message, dict):
            role = _text(message.get("role"))
            if role == "assistant":
                history = length
            part = role + FIELD_END + _content(message.get("content")) + MESSAGE_END
        else:
            part = _text(message) + MESSAGE_END
        parts.append(part)
        length += len(part)
    return "".join(parts), history


def _content(content: Any) -> str:
    """A message's text: a string, or its parts' texts (an image by its URL)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, dict):
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            parts.append(_text(part.get("text") if part.get("text") is not None else url))
    return "".join(parts)


def _prompt(prompt: Any) -> str:
    """A completion prompt: text, token ids, or a batch of either (all of them, in order)."""
    if isinstance(prompt, str):
        return prompt
    if not isinstance(prompt, list):
        return ""
    if all(isinstance(item, int) for item in prompt):
        return "".join(f"{item} " for item in prompt)  # "1 2 " is no prefix of "1 23 "
    return MESSAGE_END.join(_prompt(item) for item in prompt)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""
