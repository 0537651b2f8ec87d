"""Malformed and adversarial bodies on every POST route: always a JSON 4xx (or a normal answer),
never a 5xx, and the server stays healthy with every KV page back in the pool."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.app import create_app
from serving.settings.resolve import ServerSettings
from serving.testing import TINY_ENGINE_KNOBS, ServerThread, shared_llm
from tests.serving.fuzz_bodies import JUNK, MUTABLE, RAW_BODIES, VALID, mutate

# Structured fuzzing of these routes runs by default; of the others, with -m slow.
FUZZ_FAST = ("/generate", "/v1/chat/completions")
POST_ROUTES = [
    "/generate",
    "/generate_stream",
    "/",
    "/invocations",
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/tokenize",
    "/detokenize",
]
OPENAI_SHAPED = ("/v1", "/tokenize", "/detokenize")  # error bodies in OpenAI's shape
STREAMING = {"/generate_stream"}


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    llm = shared_llm(tiny_model_dir, **TINY_ENGINE_KNOBS)
    # A short context keeps the valid requests the fuzzer stumbles on cheap.
    settings = ServerSettings(model=tiny_model_dir, max_total_tokens=32, max_body_bytes=1 << 16)
    with ServerThread(create_app(llm, settings)) as running:
        running.llm = llm
        with httpx.Client(base_url=running.url, timeout=120) as client:
            running.client = client
            yield running


def check_response(response: httpx.Response, path: str) -> None:
    """No 5xx; errors are JSON with an error field; streams end cleanly."""
    assert response.status_code < 500, (response.status_code, response.text[:500])
    content_type = response.headers.get("content-type", "")
    if response.status_code != 200:
        assert 400 <= response.status_code < 500
        body = response.json()
        assert "error" in body, body
        if path.startswith(OPENAI_SHAPED):
            assert body["error"]["message"]
        else:
            assert body["error"] and body["error_type"]
        return
    if content_type.startswith("text/event-stream"):
        events = [
            line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")
        ]
        assert events, response.text[:300]
        for event in events:
            if event == "[DONE]":
                continue
            payload = json.loads(event)
            assert "error" not in payload, payload
        if path == "/v1/responses":  # Responses streams end with their last event, no [DONE]
            assert json.loads(events[-1])["type"] in ("response.completed", "response.incomplete")
        elif path.startswith("/v1"):
            assert events[-1] == "[DONE]"
    else:
        assert response.json().get("error") is None  # a Responses object says "error": null


def post(server, path: str, body) -> None:
    if isinstance(body, bytes):
        response = server.client.post(path, content=body)
    else:
        response = server.client.post(path, content=json.dumps(body).encode())
    check_response(response, path)


FUZZ = settings(
    max_examples=60,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


@pytest.mark.parametrize(
    "path",
    [p if p in FUZZ_FAST else pytest.param(p, marks=pytest.mark.slow) for p in POST_ROUTES],
)
@FUZZ
@given(data=st.data())
def test_fuzz_structured_bodies(server, path, data):
    kind = path if path.startswith(OPENAI_SHAPED) else "tgi"
    body = data.draw(VALID[kind], label="valid body")
    for _ in range(data.draw(st.integers(min_value=0, max_value=3), label="mutations")):
        where = data.draw(st.sampled_from(MUTABLE[kind]), label="path")
        mutate(body, where, data.draw(JUNK, label="junk"))
    post(server, path, body)


@pytest.mark.parametrize("path", POST_ROUTES)
@settings(FUZZ, max_examples=25)
@given(body=st.one_of(RAW_BODIES, JUNK.map(lambda value: json.dumps(value).encode())))
def test_fuzz_raw_bodies(server, path, body):
    post(server, path, body)


@pytest.mark.parametrize("path", POST_ROUTES)
def test_oversized_and_odd_requests(server, path):
    client = server.client
    huge = client.post(path, content=b'{"inputs": "' + b"a" * (1 << 17) + b'"}')
    assert huge.status_code == 413 and "error" in huge.json()

    def chunks():
        yield b'{"inputs": "'
        yield b"b" * (1 << 17)
        yield b'"}'

    chunked = client.post(path, content=chunks())  # no content-length: counted while reading
    assert chunked.status_code == 413
    form = client.post(path, data={"inputs": "x"})
    assert form.status_code == 415 and "error" in form.json()  # form-encoded: not JSON


def test_server_healthy_afterwards(server):
    assert server.client.get("/health").status_code == 200
    ok = server.client.post(
        "/generate", json={"inputs": "Hello", "parameters": {"max_new_tokens": 2}}
    )
    assert ok.status_code == 200
    deadline = time.monotonic() + 30
    while True:
        stats = server.llm.stats()
        if stats["num_running"] == stats["num_waiting"] == stats["kv_pages_used"] == 0:
            break
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)
    metrics = server.client.get("/metrics").text
    assert "jaxgen_request_failure_total 0.0" in metrics


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/completions", {"prompt": "a", "logit_bias": {"1": 100.5}}, "logit_bias"),
        ("/v1/completions", {"prompt": "a", "logit_bias": {"1.5": 1}}, "logit_bias"),
        ("/v1/completions", {"prompt": "a", "logit_bias": {"99999999": 1}}, "logit_bias"),
        ("/v1/completions", {"prompt": "a", "logit_bias": "1"}, "logit_bias"),
        ("/v1/completions", {"prompt": "a", "prompt_logprobs": -1}, "prompt_logprobs"),
        ("/v1/completions", {"prompt": "a", "prompt_logprobs": 21}, "prompt_logprobs"),
        ("/v1/completions", {"prompt": "a", "prompt_logprobs": "2"}, "prompt_logprobs"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "a"}], "prompt_logprobs": 1.5},
            "prompt_logprobs",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "a"}], "logit_bias": {"a": 1}},
            "logit_bias",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "a"}], "prompt_logprobs": 0, "stream": True},
            "prompt_logprobs",
        ),
        ("/v1/completions", {"prompt": "a", "stop_token_ids": [-1]}, "stop_token_ids"),
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"messages": "hi"}, "messages"),
        ("/detokenize", {"tokens": [1, "2"]}, "tokens"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
    ],
)
def test_new_fields_are_refused_by_name(server, path, body, param):
    response = server.client.post(path, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
