"""Responses' output items stream one after the other: a ``function_call`` item opens only
after the item before it is done (two calls, text then a call), as OpenAI's stream them."""

from __future__ import annotations

import json
import types

from jaxgen.tool_calling import ToolRequest
from serving.openai.responses_routes import ResponseBuilder

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
        },
    }
    for name in ("first", "second")
]


def events_of(chunks: list[bytes]) -> list[dict]:
    return [json.loads(c.decode().split("data: ", 1)[1]) for c in chunks]


def test_items_open_only_after_the_one_before_is_done():
    tools = ToolRequest.build(TOOLS, "auto", tool_call_parser="hermes")
    parsed = types.SimpleNamespace(chat=types.SimpleNamespace(tools=tools))
    builder = ResponseBuilder(parsed, "resp_test", state=None)
    text = (
        "Calling both.\n"
        '<tool_call>\n{"name": "first", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "second", "arguments": {"x": 2}}\n</tool_call>'
    )
    chunks = []
    for piece in [text[i : i + 7] for i in range(0, len(text), 7)]:
        chunks += builder.feed(piece)
    end = builder.tool_stream.finish()  # what ``finish`` does before the response object
    chunks += builder._calls(end.tool_call_deltas) + builder._close_open_items()
    events = events_of(chunks)
    open_items: set[int] = set()
    for event in events:
        if event["type"] == "response.output_item.added":
            assert not open_items, f"item {event['output_index']} opened while {open_items} open"
            open_items.add(event["output_index"])
        elif event["type"] == "response.output_item.done":
            open_items.discard(event["output_index"])
    kinds = [item["type"] for item in builder.items]
    assert kinds == ["message", "function_call", "function_call"]
    assert [item["name"] for item in builder.items[1:]] == ["first", "second"]
    assert all(item["status"] == "completed" for item in builder.items)
