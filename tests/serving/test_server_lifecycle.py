"""The HTTP server's lifecycle end to end: a client's disconnect aborts its request, drain aborts
what outlives its timeout, health while loading and after a failed load, an engine failure
ends requests with errors, SIGTERM drains and exits 0."""

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

from serving.app import create_app
from serving.settings.resolve import ServerSettings
from serving.testing import ServerThread, free_port
from tests.serving.server_checks import (
    LONG_PROMPT,
    PROMPT,
    metric_value,
    sse_payloads,
    wait_idle,
    wait_running,
)


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
    runner = server.llm.engine.runner

    def broken_step(params, kv_cache):  # a step that fails once (the runner's hook)
        runner.after_step = None
        raise RuntimeError("injected failure")

    payload = {"inputs": PROMPT, "parameters": {"max_new_tokens": 50}}
    runner.after_step = broken_step
    try:
        with http.stream("POST", "/generate_stream", json=payload) as response:
            assert response.status_code == 200
            events = sse_payloads(response.iter_lines())
        assert events[-1]["error_type"] == "generation"
        assert "injected failure" in events[-1]["error"]
        runner.after_step = broken_step
        failed = http.post(
            "/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 50}
        )
        assert failed.status_code == 500
        assert "injected failure" in failed.json()["error"]["message"]
    finally:
        runner.after_step = None
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
