"""The HTTP server end to end: real clients (openai, huggingface_hub, httpx) over loopback HTTP
against a uvicorn server running the tiny model."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from huggingface_hub import InferenceClient

from jaxgen.sampling_params import SamplingParams
from serving.app import create_app
from serving.settings.resolve import ServerSettings
from serving.testing import ServerThread, free_port

PROMPT = "The quick brown fox"
# 151 tokens: with up to 100 new tokens a sequence stays within one block-table width bucket,
# so long-running requests compile few programs.
LONG_PROMPT = "hello " * 150
METRIC_NAMES = [
    "jaxgen_num_requests_running",
    "jaxgen_num_requests_waiting",
    "jaxgen_kv_cache_usage_ratio",
    "jaxgen_num_preemptions_total",
    "jaxgen_prompt_tokens_total",
    "jaxgen_generation_tokens_total",
    "jaxgen_request_success_total",
    "jaxgen_time_to_first_token_seconds",
    "jaxgen_time_per_output_token_seconds",
    "jaxgen_e2e_request_latency_seconds",
    "jaxgen_request_queue_time_seconds",
    "jaxgen_batch_size",
]


@pytest.fixture(scope="module")
def server(llm, tiny_model_dir):
    settings = ServerSettings(model=tiny_model_dir, served_model_name="tiny")
    with ServerThread(create_app(llm, settings)) as running:
        running.llm = llm
        warm = httpx.post(
            f"{running.url}/generate",
            timeout=120,
            json={"inputs": PROMPT, "parameters": {"max_new_tokens": 4}},
        )
        assert warm.status_code == 200, warm.text
        yield running


def engine_output(llm, prompt, **params):
    """Text and token ids of the engine run directly (no server)."""

    async def run():
        last = None
        async for out in llm.generate(prompt, SamplingParams(**params), delta=False):
            last = out
        return last.outputs[0].text, last.outputs[0].token_ids

    return asyncio.run(run())


def chat_prompt_ids(llm, messages):
    text = llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return llm.tokenizer.encode(text, add_special_tokens=False)


def wait_idle(llm, timeout: float = 20.0) -> dict:
    """Waits until the engine runs nothing and every KV page is back in the pool."""
    deadline = time.monotonic() + timeout
    while True:
        stats = llm.stats()
        if stats["num_running"] == 0 and stats["num_waiting"] == 0 and stats["kv_pages_used"] == 0:
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(f"engine not idle: {stats}")
        time.sleep(0.02)


def wait_running(llm, count: int = 1, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while llm.stats()["num_running"] < count:
        assert time.monotonic() < deadline, llm.stats()
        time.sleep(0.01)


def sse_payloads(lines) -> list:
    events = []
    for line in lines:
        if line.startswith("data:"):
            payload = line[5:].strip()
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def metric_value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


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
        assert all(len(top) == 2 for top in choice.logprobs.top_logprobs)


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


# -- validation and limits ---------------------------------------------------------------------------
def test_limits_are_named(http):
    long_prompt = "hello " * 300
    too_long = http.post("/generate", json={"inputs": long_prompt})
    assert too_long.status_code == 422
    assert too_long.json()["error_type"] == "validation"
    assert "255" in too_long.json()["error"] and "max_input_tokens" in too_long.json()["error"]
    too_many = http.post(
        "/generate", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 300}}
    )
    assert too_many.status_code == 422 and "256" in too_many.json()["error"]
    assert "max_total_tokens" in too_many.json()["error"]
    oai_error = http.post(
        "/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 300}
    )
    assert oai_error.status_code == 400
    error = oai_error.json()["error"]
    assert error["param"] == "max_tokens" and "max_total_tokens" in error["message"]
    assert set(error) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/generate", b"{not json", 400),
        ("/generate", b"\xff\xfe{}", 400),
        ("/generate", b'{"inputs": "x", "parameters": {"temperature": NaN}}', 400),
        ("/generate", {"inputs": PROMPT, "parameters": {"temperature": "hot"}}, 422),
        ("/generate", {"inputs": PROMPT, "parameters": {"top_p": 1.5}}, 422),
        ("/generate", {"inputs": PROMPT, "parameters": {"max_new_tokens": 0}}, 422),
        ("/generate", {"inputs": PROMPT, "parameters": {"stop": ["a", "b", "c", "d", "e"]}}, 422),
        ("/generate", {"inputs": ""}, 422),
        ("/generate_stream", {"parameters": {}}, 422),
        ("/", {"inputs": PROMPT, "stream": "yes"}, 422),
        ("/v1/completions", {"model": "tiny", "prompt": [1, -5]}, 400),
        ("/v1/completions", {"model": "tiny", "prompt": [10**9]}, 400),
        ("/v1/completions", {"model": "tiny", "prompt": PROMPT, "temperature": -1}, 400),
        ("/v1/completions", {"model": "tiny", "prompt": PROMPT, "logprobs": 99}, 400),
        ("/v1/chat/completions", {"model": "tiny", "messages": []}, 400),
        (
            "/v1/chat/completions",
            {"model": "tiny", "messages": [{"role": "bot", "content": "x"}]},
            400,
        ),
        (
            "/v1/chat/completions",
            {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
            400,
        ),
        (
            "/v1/chat/completions",
            {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "n": 0},
            400,
        ),
    ],
)
def test_bad_requests_get_json_4xx(http, path, body, status):
    if isinstance(body, bytes):
        response = http.post(path, content=body)
    else:
        response = http.post(path, json=body)
    assert response.status_code == status, response.text
    payload = response.json()
    if path.startswith("/v1"):
        assert payload["error"]["message"]
    else:
        assert payload["error"] and payload["error_type"] == "validation"


def test_sampling_param_errors_name_the_api_parameter(http):
    response = http.post(
        "/v1/completions",
        json={"model": "tiny", "prompt": PROMPT, "min_tokens": 50, "max_tokens": 5},
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "min_tokens"


def test_metrics(http):
    http.post("/generate", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 3}})
    text = http.get("/metrics").text
    for name in METRIC_NAMES:
        assert name in text, name
    assert metric_value(text, 'jaxgen_request_success_total{finish_reason="length"}') >= 1
    assert metric_value(text, "jaxgen_time_to_first_token_seconds_count") >= 1
    assert metric_value(text, "jaxgen_batch_size_count") >= 1
    assert metric_value(text, "jaxgen_generation_tokens_total") >= 3


# -- admission, disconnects, draining ------------------------------------------------------------------
def test_overload_gives_429_while_admitted_complete(llm, tiny_model_dir):
    settings = ServerSettings(
        model=tiny_model_dir, max_concurrent_requests=2, served_model_name="m"
    )
    payload = {
        "model": "m",
        "prompt": LONG_PROMPT,
        "max_tokens": 100,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with ServerThread(create_app(llm, settings)) as server:
        results: list = []
        started = threading.Barrier(3)

        def stream_one():
            with httpx.Client(base_url=server.url, timeout=120) as client:
                with client.stream("POST", "/v1/completions", json=payload) as response:
                    lines = response.iter_lines()
                    first = next(line for line in lines if line.startswith("data:"))
                    started.wait()
                    events = sse_payloads([first, *lines])
            results.append(events)

        threads = [threading.Thread(target=stream_one) for _ in range(2)]
        for thread in threads:
            thread.start()
        started.wait(timeout=60)
        with httpx.Client(base_url=server.url, timeout=30) as client:
            tgi = client.post("/generate", json={"inputs": PROMPT})
            assert tgi.status_code == 429
            assert tgi.json() == {"error": "Model is overloaded", "error_type": "overloaded"}
            v1 = client.post("/v1/completions", json={"model": "m", "prompt": PROMPT})
            assert v1.status_code == 429 and v1.json()["error"]["message"] == "Model is overloaded"
            for thread in threads:
                thread.join(timeout=120)
            assert len(results) == 2
            for events in results:
                assert events[-1] == "[DONE]"
                text = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
                assert events[-2]["choices"][0]["finish_reason"] == "length", text
            after = client.post(
                "/generate", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 2}}
            )
            assert after.status_code == 200
            rejected = client.get("/metrics").text
            assert metric_value(rejected, 'jaxgen_request_rejected_total{reason="overloaded"}') == 2
    wait_idle(llm)


def test_stream_disconnect_aborts(server, http):
    before = metric_value(
        http.get("/metrics").text, 'jaxgen_request_success_total{finish_reason="abort"}'
    )
    with httpx.Client(base_url=server.url, timeout=60) as client:
        with client.stream(
            "POST",
            "/generate_stream",
            json={"inputs": LONG_PROMPT, "parameters": {"max_new_tokens": 100}},
        ) as response:
            for line in response.iter_lines():
                if line.startswith("data:"):
                    break
    stats = wait_idle(server.llm)
    assert stats["kv_pages_used"] == 0
    after = metric_value(
        http.get("/metrics").text, 'jaxgen_request_success_total{finish_reason="abort"}'
    )
    assert after == before + 1


def test_non_stream_disconnect_aborts(server, http):
    before = metric_value(
        http.get("/metrics").text, 'jaxgen_request_success_total{finish_reason="abort"}'
    )
    body = json.dumps(
        {"model": "tiny", "prompt": LONG_PROMPT, "max_tokens": 100, "ignore_eos": True}
    )
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(request)
        wait_running(server.llm)
    stats = wait_idle(server.llm)
    assert stats["kv_pages_used"] == 0
    after = metric_value(
        http.get("/metrics").text, 'jaxgen_request_success_total{finish_reason="abort"}'
    )
    assert after == before + 1


def test_drain_aborts_after_timeout(llm, tiny_model_dir):
    settings = ServerSettings(model=tiny_model_dir)
    app = create_app(llm, settings)
    state = app.state.server
    payload = {"inputs": LONG_PROMPT, "parameters": {"max_new_tokens": 100}}
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        with client.stream("POST", "/generate_stream", json=payload) as response:
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data:"))
            drain = asyncio.run_coroutine_threadsafe(state.drain(0.05), state.loop)
            events = sse_payloads(lines)
        drain.result(timeout=30)
        assert events[-1]["error_type"] == "generation" and "aborted" in events[-1]["error"]
        assert client.get("/health").status_code == 503
        refused = client.post("/generate", json=payload)
        assert refused.status_code == 503 and refused.json()["error_type"] == "unavailable"
    wait_idle(llm)


class BorrowedLLM:
    """The shared engine, handed to an app as if it had loaded it (its shutdown is a no-op)."""

    def __init__(self, llm):
        self._llm = llm

    def __getattr__(self, name):
        return getattr(self._llm, name)

    def shutdown(self, timeout: float = 10.0) -> None:
        pass


def test_health_while_loading_and_after_load_failure(llm, tiny_model_dir):
    release = threading.Event()

    def slow_loader():
        release.wait(30)
        return BorrowedLLM(llm)

    settings = ServerSettings(model=tiny_model_dir, served_model_name="m")
    with ServerThread(create_app(slow_loader, settings)) as server:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            loading = client.get("/health")
            assert loading.status_code == 503 and loading.json()["status"] == "loading"
            refused = client.post("/v1/completions", json={"model": "m", "prompt": PROMPT})
            assert refused.status_code == 503 and refused.json()["error"]["message"]
            assert client.get("/info").json()["status"] == "loading"
            release.set()
            deadline = time.monotonic() + 30
            while client.get("/health").status_code != 200:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            ok = client.post(
                "/generate", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 2}}
            )
            assert ok.status_code == 200

    errors = []

    def broken_loader():
        raise FileNotFoundError("no such model")

    app = create_app(broken_loader, settings, on_fatal=errors.append)
    with ServerThread(app) as server:
        deadline = time.monotonic() + 30
        while not errors:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        failed = httpx.get(f"{server.url}/health")
        assert failed.status_code == 503
        assert failed.json() == {"status": "failed", "error": "no such model"}


def test_engine_failure_ends_requests_with_errors(server, http):
    engine = server.llm.engine
    working_step = engine.__dict__.get("step", engine.step)

    def broken_step():
        engine.step = working_step  # fail once
        raise RuntimeError("injected failure")

    payload = {"inputs": PROMPT, "parameters": {"max_new_tokens": 50}}
    engine.step = broken_step
    try:
        with http.stream("POST", "/generate_stream", json=payload) as response:
            assert response.status_code == 200
            events = sse_payloads(response.iter_lines())
        assert events[-1]["error_type"] == "generation"
        assert "injected failure" in events[-1]["error"]
        engine.step = broken_step
        failed = http.post(
            "/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 50}
        )
        assert failed.status_code == 500
        assert "injected failure" in failed.json()["error"]["message"]
    finally:
        engine.step = working_step
    wait_idle(server.llm)
    assert http.get("/health").status_code == 200
    again = http.post("/generate", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 2}})
    assert again.status_code == 200


@pytest.mark.slow  # 13-30 s on 2 cores: the default suite stays near 15 min
def test_sigterm_drains_and_exits_zero(tiny_model_dir):
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "serving",
        "--model",
        tiny_model_dir,
        "--port",
        str(port),
        "--max-model-len",
        "256",
        "--kv-cache-memory",
        "4MiB",
        "--max-rolling-batch-size",
        "4",
        "--max-rolling-batch-prefill-tokens",
        "256",
        "--drain-timeout",
        "60",
        "--served-model-name",
        "m",
        "--log-level",
        "warning",
    ]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None, process.stdout.read().decode()
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not become healthy"
            time.sleep(0.2)
        payload = {
            "model": "m",
            "prompt": LONG_PROMPT,
            "max_tokens": 100,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.Client(base_url=url, timeout=120) as client:
            with client.stream("POST", "/v1/completions", json=payload) as response:
                lines = response.iter_lines()
                first = next(line for line in lines if line.startswith("data:"))
                process.send_signal(signal.SIGTERM)
                with httpx.Client(base_url=url, timeout=10) as other:
                    deadline = time.monotonic() + 10
                    while other.get("/health").status_code != 503:
                        assert time.monotonic() < deadline, "health never turned 503"
                        time.sleep(0.01)
                    refused = other.post("/generate", json={"inputs": PROMPT})
                    assert refused.status_code == 503
                    assert refused.json()["error_type"] == "unavailable"
                events = sse_payloads([first, *lines])
        assert events[-1] == "[DONE]"
        assert events[-2]["choices"][0]["finish_reason"] == "length"
        text = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
        assert len(events) >= 100 and text
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
