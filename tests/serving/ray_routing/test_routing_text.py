"""``serving/ray_routing/routing_text.py``: the prompt text a request body starts with."""

from __future__ import annotations

import json

from serving.ray_routing.routing_text import MAX_ROUTING_CHARS, RoutingText, routing_text


def text(path: str, body) -> str:
    return routing_text(path, json.dumps(body).encode()).text


def test_the_next_turn_of_a_chat_starts_with_this_turn():
    turn_1 = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of France?"},
    ]
    turn_2 = [
        *turn_1,
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": [{"type": "text", "text": "And Italy?"}]},
    ]
    first = text("/v1/chat/completions", {"model": "m", "messages": turn_1})
    second = text("/v1/chat/completions", {"model": "m", "messages": turn_2, "stream": True})
    assert second.startswith(first) and len(second) > len(first)
    assert "Capital of France?" in first and "And Italy?" in second


def test_the_history_is_what_the_previous_turn_sent():
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    first = routing_text("/v1/chat/completions", json.dumps({"messages": turns}).encode())
    assert first.history == 0  # no assistant message yet
    for reply, question in [("Hello! " * 50, "Weather?"), ("Sunny.", "Tomorrow?")]:
        previous = first.text
        turns += [{"role": "assistant", "content": reply}, {"role": "user", "content": question}]
        body = json.dumps({"messages": turns}).encode()
        later = routing_text("/v1/chat/completions", body)
        assert later.text[: later.history] == previous  # however long the reply
        first = later
    items = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    responses = routing_text("/v1/responses", json.dumps({"input": items}).encode())
    assert responses.text[responses.history :].startswith("assistant")
    assert routing_text("/v1/completions", b'{"prompt": "x"}').history == 0


def test_the_model_comes_first_so_adapters_do_not_share_prefixes():
    messages = [{"role": "user", "content": "hi"}]
    base = text("/v1/chat/completions", {"model": "base", "messages": messages})
    adapter = text("/v1/chat/completions", {"model": "sql-lora", "messages": messages})
    assert base.startswith("base") and adapter.startswith("sql-lora")
    tgi = text("/generate", {"inputs": "hi", "parameters": {"adapter_id": "sql-lora"}})
    assert tgi.startswith("sql-lora") and tgi.endswith("hi")


def test_completion_prompts_text_token_ids_and_batches():
    assert text("/v1/completions", {"prompt": "Once upon"}).endswith("Once upon")
    ids = text("/v1/completions", {"prompt": [1, 2, 3]})
    longer = text("/v1/completions", {"prompt": [1, 2, 34]})
    assert ids.endswith("1 2 3 ") and not longer.startswith(ids)  # token 3 is not token 34
    batch = text("/v1/completions", {"prompt": ["first", "second"]})
    assert batch.index("first") < batch.index("second")


def test_tgi_responses_invocations_and_the_chat_batch():
    assert text("/generate_stream", {"inputs": "Hello"}).endswith("Hello")
    assert text("/", {"inputs": "Hello"}).endswith("Hello")
    assert text("/invocations", {"messages": [{"role": "user", "content": "x"}]}).count("x") == 1
    responses = text("/v1/responses", {"instructions": "Be kind.", "input": "Hi"})
    assert responses.index("Be kind.") < responses.index("Hi")
    items = text("/v1/responses", {"input": [{"role": "user", "content": "Hey"}]})
    assert "Hey" in items
    conversations = [[{"role": "user", "content": "one"}], [{"role": "user", "content": "two"}]]
    batch = text("/v1/chat/completions/batch", {"messages": conversations})
    assert "one" in batch and "two" not in batch


def test_other_routes_and_bad_bodies_have_no_text():
    assert text("/v1/embeddings", {"input": "hi"}) == ""
    assert text("/metrics", {}) == ""
    for body in (b"", b"not json", b"[1, 2]", b"\xff\xfe"):
        assert routing_text("/v1/completions", body) == RoutingText()
    odd = text("/v1/chat/completions", {"messages": [None, 3, {"role": 1, "content": {"x": 1}}]})
    assert isinstance(odd, str)  # never raises: the replica validates the body


def test_the_text_is_bounded():
    long = text("/v1/completions", {"prompt": "x" * (MAX_ROUTING_CHARS + 100)})
    assert len(long) == MAX_ROUTING_CHARS
    messages = [{"role": "user", "content": "x" * MAX_ROUTING_CHARS}, {"role": "assistant"}]
    cut = routing_text("/v1/chat/completions", json.dumps({"messages": messages}).encode())
    assert cut.history == len(cut.text) == MAX_ROUTING_CHARS
