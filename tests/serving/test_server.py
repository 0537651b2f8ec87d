"""The HTTP server end to end: real clients (openai, huggingface_hub, httpx) over loopback HTTP
against a uvicorn server running the tiny model."""

from __future__ import annotations

import pytest
from huggingface_hub import InferenceClient

from tests.serving.server_checks import (
    METRIC_NAMES,
    PROMPT,
    chat_prompt_ids,
    engine_output,
    metric_value,
    sse_payloads,
)


# -- basics ----------------------------------------------------------------------------------------
def test_health_info_models(http):
    assert http.get("/health").json() == {"status": "ok"}
    assert http.get("/ping").status_code == 200
    info = http.get("/info").json()
    assert info["model_id"] == "tiny"
    assert info["max_total_tokens"] == 256 and info["max_input_tokens"] == 255
    assert info["max_concurrent_requests"] == 128 and info["version"]
    engine = info["engine"]  # the weights' and KV pool's form
    assert engine["quantization"] == "auto" and engine["kv_cache_dtype"] == "auto"
    assert list(engine["weight_dtypes"]) == ["float32"] and engine["parameter_bytes"] > 0
    models = http.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"]


def test_unknown_route_and_method_are_json(http):
    missing = http.get("/nope")
    assert missing.status_code == 404 and "error" in missing.json()
    wrong = http.get("/generate")
    assert wrong.status_code == 405 and "error" in wrong.json()
    v1 = http.get("/v1/chat/completions")
    assert v1.status_code == 405 and "message" in v1.json()["error"]


# -- OpenAI ----------------------------------------------------------------------------------------
def test_completion_greedy_matches_engine(server, oai):
    text, token_ids = engine_output(server.llm, PROMPT, max_tokens=12, temperature=0)
    result = oai.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0)
    assert result.choices[0].text == text
    assert result.usage.completion_tokens == len(token_ids)
    assert result.usage.prompt_tokens == len(server.llm.tokenizer.encode(PROMPT))
    assert result.choices[0].finish_reason in ("length", "stop")


def test_completion_stream_equals_non_stream(oai):
    kwargs = dict(model="tiny", prompt=PROMPT, max_tokens=10, temperature=0)
    whole = oai.completions.create(**kwargs)
    chunks = list(
        oai.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason


def test_chat_matches_engine_and_streams(server, oai):
    messages = [{"role": "user", "content": "Say something."}]
    ids = chat_prompt_ids(server.llm, messages)
    text, token_ids = engine_output(server.llm, ids, max_tokens=10, temperature=0)
    result = oai.chat.completions.create(
        model="tiny", messages=messages, max_tokens=10, temperature=0
    )
    assert result.choices[0].message.role == "assistant"
    assert result.choices[0].message.content == text
    assert result.usage.prompt_tokens == len(ids)
    assert result.usage.completion_tokens == len(token_ids)
    stream = oai.chat.completions.create(
        model="tiny", messages=messages, max_tokens=10, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert chunks[-1].choices[0].finish_reason == result.choices[0].finish_reason


def test_chat_max_completion_tokens_and_logprobs(oai):
    result = oai.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hi"}],
        max_completion_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    choice = result.choices[0]
    assert choice.finish_reason == "length" and result.usage.completion_tokens == 5
    content = choice.logprobs.content
    assert len(content) == 5
    for entry in content:
        tops = entry.top_logprobs
        assert len(tops) == 2
        assert [t.logprob for t in tops] == sorted((t.logprob for t in tops), reverse=True)
        assert entry.logprob == pytest.approx(tops[0].logprob, abs=1e-4)  # greedy picks the top
        assert entry.logprob <= 0


def test_completion_n_seed_logprobs(oai):
    kwargs = dict(
        model="tiny", prompt=PROMPT, max_tokens=6, temperature=1.0, n=2, seed=1234, logprobs=2
    )
    first = oai.completions.create(**kwargs)
    second = oai.completions.create(**kwargs)
    assert [c.text for c in first.choices] == [c.text for c in second.choices]
    assert sorted(c.index for c in first.choices) == [0, 1]
    assert first.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in first.choices)
    for choice in first.choices:
        assert len(choice.logprobs.token_logprobs) == len(choice.logprobs.tokens)
        # the 2 most likely and the chosen token (vLLM and OpenAI's legacy completions)
        for token, top in zip(choice.logprobs.tokens, choice.logprobs.top_logprobs, strict=True):
            assert token in top and 2 <= len(top) <= 3


def test_stop_string(oai):
    free = oai.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0)
    text = free.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), text
    stopped = oai.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop]
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == text[: text.index(stop)]
    kept = oai.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=12,
        temperature=0,
        stop=[stop],
        extra_body={"include_stop_str_in_output": True},
    )
    assert kept.choices[0].text == text[: text.index(stop) + len(stop)]


def test_completion_prompt_list_and_token_ids(server, oai):
    ids = server.llm.tokenizer.encode(PROMPT)
    result = oai.completions.create(
        model="tiny", prompt=[PROMPT, "Hello"], max_tokens=4, temperature=0
    )
    assert [c.index for c in result.choices] == [0, 1]
    by_ids = oai.completions.create(model="tiny", prompt=ids, max_tokens=4, temperature=0)
    assert by_ids.choices[0].text == result.choices[0].text


# -- TGI -------------------------------------------------------------------------------------------
@pytest.fixture
def hf_client(server, monkeypatch):
    """An InferenceClient on the test server (conftest sets HF_HUB_OFFLINE, which blocks it)."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    return InferenceClient(base_url=server.url)


def test_inference_client_details_and_stream(server, hf_client):
    client = hf_client
    text, token_ids = engine_output(server.llm, PROMPT, max_tokens=8, temperature=0)
    out = client.text_generation(PROMPT, max_new_tokens=8, details=True)
    assert out.generated_text == text
    assert out.details.generated_tokens == len(token_ids) == len(out.details.tokens)
    assert out.details.finish_reason in ("length", "eos_token")
    assert [t.id for t in out.details.tokens] == token_ids
    assert "".join(t.text for t in out.details.tokens) == text
    streamed = "".join(client.text_generation(PROMPT, max_new_tokens=8, stream=True))
    assert streamed == text
    events = list(client.text_generation(PROMPT, max_new_tokens=8, stream=True, details=True))
    assert events[-1].generated_text == text
    assert events[-1].details.generated_tokens == len(token_ids)
    assert all(e.generated_text is None for e in events[:-1])


def test_generate_details_and_timing_headers(http):
    response = http.post(
        "/generate",
        json={
            "inputs": PROMPT,
            "parameters": {
                "max_new_tokens": 5,
                "details": True,
                "decoder_input_details": True,
                "top_n_tokens": 2,
                "return_full_text": True,
            },
        },
    )
    assert response.status_code == 200, response.text
    for header in (
        "x-queue-time",
        "x-inference-time",
        "x-time-per-token",
        "x-prompt-tokens",
        "x-generated-tokens",
    ):
        assert response.headers[header].isdigit(), header
    assert response.headers["x-generated-tokens"] == "5"
    body = response.json()
    assert body["generated_text"].startswith(PROMPT)
    details = body["details"]
    assert details["finish_reason"] == "length" and details["generated_tokens"] == 5
    assert len(details["prefill"]) == int(response.headers["x-prompt-tokens"])
    assert len(details["top_tokens"]) == 5 and all(len(t) == 2 for t in details["top_tokens"])
    assert all(t["logprob"] <= 0 and t["special"] is False for t in details["tokens"])


def test_generate_stream_events_and_compat_route(http):
    payload = {"inputs": PROMPT, "parameters": {"max_new_tokens": 6, "do_sample": True, "seed": 7}}
    whole = http.post("/generate", json=payload).json()["generated_text"]
    with http.stream("POST", "/generate_stream", json=payload) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_payloads(response.iter_lines())
    assert len(events) == 6
    assert all(set(e) >= {"token", "generated_text", "details"} for e in events)
    assert "".join(e["token"]["text"] for e in events) == whole
    assert events[-1]["generated_text"] == whole
    assert events[-1]["details"] == {
        "finish_reason": "length",
        "generated_tokens": 6,
        "seed": 7,
        "input_length": events[-1]["details"]["input_length"],
    }
    compat = http.post("/", json={**payload, "stream": False})
    assert compat.json()["generated_text"] == whole
    with http.stream("POST", "/", json={**payload, "stream": True}) as response:
        assert sse_payloads(response.iter_lines())[-1]["generated_text"] == whole


def test_stop_sequence_reason(http):
    free = http.post("/generate", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 12}})
    text = free.json()["generated_text"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    stopped = http.post(
        "/generate",
        json={
            "inputs": PROMPT,
            "parameters": {"max_new_tokens": 12, "stop": [stop], "details": True},
        },
    ).json()
    assert stopped["details"]["finish_reason"] == "stop_sequence"
    assert stopped["generated_text"] == text[: text.index(stop)]


def test_metrics(http):
    http.post("/generate", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 3}})
    text = http.get("/metrics").text
    for name in METRIC_NAMES:
        assert name in text, name
    assert metric_value(text, 'jaxgen_request_success_total{finish_reason="length"}') >= 1
    assert metric_value(text, "jaxgen_time_to_first_token_seconds_count") >= 1
    assert metric_value(text, "jaxgen_batch_size_count") >= 1
    assert metric_value(text, "jaxgen_generation_tokens_total") >= 3
