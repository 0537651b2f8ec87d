"""Stored Responses through the openai SDK: ``store`` (GET, DELETE, 404 once gone),
``previous_response_id`` continuing a conversation, ``background`` (queued, polled, cancelled,
its stream replayed from ``starting_after``), ``top_logprobs``; and ``ResponseStore``'s bounds
(size, TTL) on their own."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

from serving.app import create_app
from serving.openai.response_store import ResponseStore, StoredResponse
from serving.settings.resolve import ServerSettings
from serving.testing import TINY_ENGINE_KNOBS, ServerThread, shared_llm


def state_of(server):
    return server.server.config.app.state.server


def wait_until_idle(server, timeout: float = 30.0) -> None:
    state = state_of(server)
    deadline = time.monotonic() + timeout
    while state.in_flight and time.monotonic() < deadline:
        time.sleep(0.02)
    assert state.in_flight == 0, "a background response kept its admission slot"


def test_stored_responses_are_retrieved_and_deleted(oai):
    stored = oai.responses.create(model="tiny", input="Hello!", max_output_tokens=4)
    assert stored.store is True  # OpenAI's default
    again = oai.responses.retrieve(stored.id)
    assert again.output_text == stored.output_text and again.status == stored.status
    unstored = oai.responses.create(model="tiny", input="Hello!", max_output_tokens=4, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(unstored.id)
    oai.responses.delete(stored.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(stored.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.delete(stored.id)


def test_a_streamed_response_is_stored_once_it_ends(oai):
    events = list(oai.responses.create(model="tiny", input="Hi", max_output_tokens=5, stream=True))
    final = events[-1].response
    assert events[-1].type == "response.incomplete" and final.output_text
    assert oai.responses.retrieve(final.id).output_text == final.output_text


def test_previous_response_id_continues_the_conversation(server, oai, http):
    first = oai.responses.create(
        model="tiny", input="What is 123 * 456?", instructions="Be brief.", max_output_tokens=4
    )
    second = oai.responses.create(
        model="tiny",
        input="And plus one?",
        previous_response_id=first.id,
        max_output_tokens=4,
        temperature=0,
    )
    assert second.previous_response_id == first.id
    messages = [  # instructions are not carried over, as OpenAI's
        {"role": "user", "content": "What is 123 * 456?"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And plus one?"},
    ]
    chat = oai.chat.completions.create(model="tiny", messages=messages, max_tokens=4, temperature=0)
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    assert second.output_text == chat.choices[0].message.content
    third = oai.responses.create(
        model="tiny", input="Halve it.", previous_response_id=second.id, max_output_tokens=2
    )
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens
    missing = http.post(
        "/v1/responses", json={"input": "hi", "previous_response_id": "resp_missing"}
    )
    assert missing.status_code == 404
    assert missing.json()["error"]["param"] == "previous_response_id"


def test_tool_calls_of_a_previous_response_continue_as_tool_turns(server, http):
    digit = {"type": "integer", "minimum": 0, "maximum": 9}
    parameters = {"type": "object", "properties": {"x": digit}, "required": ["x"]}
    tools = [{"type": "function", "name": "f", "parameters": parameters}]
    body = {"model": "tiny", "tools": tools, "max_output_tokens": 30, "parallel_tool_calls": False}
    first = http.post("/v1/responses", json={**body, "input": "Call f.", "tool_choice": "required"})
    call = first.json()["output"][-1]
    assert call["type"] == "function_call", first.text
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "42"}
    second = http.post(
        "/v1/responses",
        json={
            **body,
            "input": [output],
            "previous_response_id": first.json()["id"],
            "max_output_tokens": 1,
        },
    )
    assert second.status_code == 200, second.text  # the output answers the stored call
    function = {"name": "f", "arguments": call["arguments"]}
    messages = [
        {"role": "user", "content": "Call f."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call["call_id"], "type": "function", "function": function}
        ]},
        {"role": "tool", "tool_call_id": call["call_id"], "content": "42"},
    ]  # fmt: skip
    chat_tools = [{"type": "function", "function": {"name": "f", "parameters": parameters}}]
    tokens = http.post("/tokenize", json={"messages": messages, "tools": chat_tools}).json()
    assert second.json()["usage"]["input_tokens"] == tokens["count"]


def test_background_response_is_queued_then_completes(server, oai):
    response = oai.responses.create(
        model="tiny", input="What is 123 * 456?", background=True, max_output_tokens=8
    )
    assert response.background is True and response.status in ("queued", "in_progress")
    deadline = time.monotonic() + 60
    while response.status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.05)
        response = oai.responses.retrieve(response.id)
    assert response.status == "incomplete" and response.usage.output_tokens == 8
    assert response.output_text
    wait_until_idle(server)


def test_background_response_is_cancelled(server, oai, http):
    response = oai.responses.create(
        model="tiny",
        input="Write a long story about a cat.",
        background=True,
        max_output_tokens=200,
    )
    cancelled = oai.responses.cancel(response.id)
    assert cancelled.status == "cancelled"
    assert oai.responses.retrieve(response.id).status == "cancelled"
    assert oai.responses.cancel(response.id).status == "cancelled"  # again: the same answer
    wait_until_idle(server)
    assert not state_of(server).active_request_ids  # the engine request was aborted
    finished = oai.responses.create(model="tiny", input="Hi", max_output_tokens=2)
    refused = http.post(f"/v1/responses/{finished.id}/cancel")
    assert refused.status_code == 400 and "background" in refused.json()["error"]["message"]


def sse_events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def test_background_stream_is_replayed_from_starting_after(server, http):
    body = {"model": "tiny", "input": "Hi", "background": True, "stream": True}
    live = http.post("/v1/responses", json={**body, "max_output_tokens": 6})
    events = sse_events(live.text)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["response"]["status"] == "queued"
    assert events[-1]["type"] == "response.incomplete"
    response_id = events[0]["response"]["id"]
    url = f"/v1/responses/{response_id}"
    replayed = sse_events(http.get(url, params={"stream": "true", "starting_after": 5}).text)
    assert replayed == events[6:]
    assert http.get(url).json()["output"] == events[-1]["response"]["output"]
    plain = http.post("/v1/responses", json={"input": "Hi", "max_output_tokens": 2}).json()
    again = http.get(f"/v1/responses/{plain['id']}", params={"stream": "true"})
    assert again.status_code == 400 and plain["background"] is False
    wait_until_idle(server)


def test_top_logprobs_on_output_text(oai):
    response = oai.responses.create(
        model="tiny", input="Hi", max_output_tokens=4, top_logprobs=3, temperature=0
    )
    [part] = response.output[0].content
    assert len(part.logprobs) == 4
    assert "".join(entry.token for entry in part.logprobs) == part.text
    for entry in part.logprobs:
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-6  # greedy: the top one
    streamed = []
    with oai.responses.stream(
        model="tiny", input="Hi", max_output_tokens=4, top_logprobs=3, temperature=0
    ) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                streamed += event.logprobs
    assert [e.token for e in streamed] == [e.token for e in part.logprobs]
    plain = oai.responses.create(
        model="tiny", input="Hi", max_output_tokens=2, include=["message.output_text.logprobs"]
    )
    assert len(plain.output[0].content[0].logprobs) == 2  # include alone: no top entries


def test_store_size_zero_stores_nothing(tiny_model_dir):
    llm = shared_llm(tiny_model_dir, **TINY_ENGINE_KNOBS)
    settings = ServerSettings(model=tiny_model_dir, responses_store_size=0)
    with ServerThread(create_app(llm, settings)) as running:
        body = {"input": "Hi", "max_output_tokens": 2}
        answer = httpx.post(f"{running.url}/v1/responses", json=body, timeout=60).json()
        assert answer["store"] is False
        gone = httpx.get(f"{running.url}/v1/responses/{answer['id']}", timeout=60)
        assert gone.status_code == 404
        background = httpx.post(
            f"{running.url}/v1/responses", json={**body, "background": True}, timeout=60
        )
        assert background.status_code == 400
        assert background.json()["error"]["param"] == "background"


# -- ResponseStore's bounds ------------------------------------------------------------------------
class Builder:
    def __init__(self, response_id: str):
        self.id = response_id

    def response(self) -> dict:
        return {"id": self.id, "status": "completed", "output": []}


def test_store_keeps_at_most_size_and_evicts_the_oldest_finished(monkeypatch):
    store = ResponseStore(size=2, ttl=0)
    running = StoredResponse(Builder("run"), [], background=True)  # not started: running
    store.put(running)
    for name in ("a", "b", "c"):
        store.put(StoredResponse(Builder(name), []))
    assert store.get("run") is running  # never evicted while it runs
    assert [name for name in ("a", "b", "c") if store.get(name)] == ["c"]


def test_store_forgets_finished_responses_after_ttl(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    store = ResponseStore(size=10, ttl=60)
    store.put(StoredResponse(Builder("old"), []))
    now[0] += 30
    store.put(StoredResponse(Builder("new"), []))
    now[0] += 31
    assert store.get("old") is None and store.get("new") is not None
    now[0] += 30
    assert store.get("new") is None and len(store) == 0


def test_a_background_response_cancelled_before_it_starts_still_ends():
    """Cancelled before its task's first step, the response is cancelled and its admission
    slot released all the same."""

    class Running(Builder):
        status = "queued"

        def cancel(self):
            self.status = "cancelled"

        def response(self):
            return {"id": self.id, "status": self.status, "output": []}

    async def events():
        yield b"never"

    async def scenario():
        entry = StoredResponse(Running("bg"), [], background=True)
        released = []
        entry.run(events(), lambda: released.append(True))
        await entry.cancel()  # before the task ran at all
        return entry, released

    entry, released = asyncio.run(scenario())
    assert released == [True] and not entry.running and entry.status == "cancelled"
    assert entry.events == []
