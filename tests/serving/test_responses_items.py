"""Responses' output items stream one after the other: a ``function_call`` item opens only
after the item before it is done (two calls, text then a call), as OpenAI's stream them."""

from __future__ import annotations

import json
import types

from jaxgen.tool_calling import ToolRequest
from serving.openai.response_builder import ResponseBuilder

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


def test_reasoning_input_items_reach_the_template(server, http):
    """A ``reasoning`` input item goes to the template as the next assistant turn's
    ``reasoning_content`` (chat's assistant ``reasoning_content`` likewise)."""
    template = (
        "{% for m in messages %}{{ m['role'] }}:{{ m.get('reasoning_content') or '' }}"
        "|{{ m['content'] }}\n{% endfor %}"
    )
    tokenizer = server.llm.tokenizer
    original = tokenizer.chat_template
    tokenizer.chat_template = template
    answer = [{"role": "assistant", "content": "Paris."}]
    thought = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Think hard"}]}
    question = [{"role": "user", "content": "Capital of France?"}]
    try:
        body = {"model": "tiny", "max_output_tokens": 1}
        plain = http.post("/v1/responses", json={**body, "input": question + answer}).json()
        reasoned = http.post(
            "/v1/responses", json={**body, "input": [*question, thought, *answer]}
        ).json()
        bad = http.post(
            "/v1/responses",
            json={**body, "input": [{"type": "reasoning", "summary": [{"type": "x"}]}]},
        )
        chat = [*question, {**answer[0], "reasoning_content": "Think hard"}]
        tokens = http.post("/tokenize", json={"messages": chat}).json()["tokens"]
    finally:
        tokenizer.chat_template = original
    assert reasoned["usage"]["input_tokens"] > plain["usage"]["input_tokens"]
    assert bad.status_code == 400 and bad.json()["error"]["param"].startswith("input[0].summary")
    assert "assistant:Think hard|Paris." in tokenizer.decode(tokens)
