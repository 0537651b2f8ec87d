"""Hardening of the HTTP server: slow clients time out without touching the engine, connections
are capped, streams cut short never look complete, unknown models are 404, non-JSON bodies are
415, and an engine whose step fails recovers, or is reported dead."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import threading
import time

import httpx
import openai
import pytest
from huggingface_hub import InferenceClient

from jaxgen.async_llm import AsyncLLM
from serving.app import create_app
from serving.launch.server import DrainingServer, ServerThread, exit_code, uvicorn_config
from serving.settings.resolve import ServerSettings, resolve_settings
from serving.testing import TINY_ENGINE_KNOBS, free_port
from tests.engine.test_engine_recovery import inject_fault
from tests.serving.server_checks import sse_payloads

PROMPT = "The quick brown fox"
LONG_PROMPT = "hello " * 150


@pytest.fixture(scope="module")
def server(llm, tiny_model_dir):
    settings = ServerSettings(
        model=tiny_model_dir,
        served_model_name="tiny",
        model_aliases=("tiny-alias",),
        body_read_timeout=1.0,
        header_read_timeout=1.0,
        keep_alive_timeout=0.5,
    )
    with ServerThread(create_app(llm, settings)) as running:
        running.llm = llm
        yield running


def raw_exchange(port: int, chunks: list[bytes], gap: float = 0.0, limit: float = 10.0) -> bytes:
    """Sends ``chunks`` (``gap`` s apart) on a fresh connection; returns all it reads until the
    server closes it. Fails if that takes over ``limit`` s."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=limit) as sock:
        try:
            for chunk in chunks:
                sock.sendall(chunk)
                time.sleep(gap)
        except OSError:  # the server closed first
            pass
        received = b""
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            received += data
    assert time.monotonic() - start < limit
    return received


def request_head(path: str, length: int, content_type: str = "application/json") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def steps(llm) -> int:
    return llm.stats()["steps"]


# -- (1) slow clients ------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/generate", "/v1/completions"])
def test_short_body_gets_408_and_the_connection_closes(server, path):
    before = steps(server.llm)
    body = b'{"inputs": "x"}'
    reply = raw_exchange(server.port, [request_head(path, len(body) + 50) + body])
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b"connection: close" in reply.lower()
    assert steps(server.llm) == before


def test_dribbled_body_gets_408(server):
    body = b'{"inputs": "hello", "parameters": {"max_new_tokens": 2}}'
    chunks = [request_head("/generate", len(body))] + [bytes([b]) for b in body]
    start = time.monotonic()
    reply = raw_exchange(server.port, chunks, gap=0.1)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert time.monotonic() - start < 3.0


def test_slow_headers_get_408_and_silent_connections_close(server):
    head = b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    reply = raw_exchange(server.port, [bytes([b]) for b in head], gap=0.05, limit=5.0)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert raw_exchange(server.port, [], limit=5.0) == b""  # never sent a byte: closed


def test_many_half_sent_requests_are_all_released(server):
    sockets = []
    try:
        for _ in range(50):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sock.sendall(request_head("/generate", 100) + b"{")
            sockets.append(sock)
        for sock in sockets:
            assert sock.recv(4096).startswith(b"HTTP/1.1 408")
    finally:
        for sock in sockets:
            sock.close()
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200


def test_idle_keep_alive_connection_times_out(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        start = time.monotonic()
        assert sock.recv(4096) == b""  # closed by the server, not by the 5 s socket timeout
        assert time.monotonic() - start < 3.0


def test_connections_are_capped(llm, tiny_model_dir):
    settings = ServerSettings(model=tiny_model_dir, max_connections=3, header_read_timeout=30)
    with ServerThread(create_app(llm, settings)) as running:
        idle = [socket.create_connection(("127.0.0.1", running.port)) for _ in range(3)]
        try:
            time.sleep(0.2)
            refused = httpx.get(f"{running.url}/health", timeout=5)
            assert refused.status_code == 503
        finally:
            for sock in idle:
                sock.close()
        deadline = time.monotonic() + 5
        while httpx.get(f"{running.url}/health", timeout=5).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_timeout_flags_parse():
    settings = resolve_settings(
        {
            "body_read_timeout": "2.5",
            "header_read_timeout": 4,
            "keep_alive_timeout": 1,
            "max_connections": "9",
            "served_model_name": ["a", "b", "c"],
        },
        environ={},
    )
    assert (settings.body_read_timeout, settings.header_read_timeout) == (2.5, 4.0)
    assert (settings.keep_alive_timeout, settings.max_connections) == (1.0, 9)
    assert settings.model_name == "a" and settings.model_aliases == ("b", "c")
    defaults = ServerSettings()
    assert (defaults.body_read_timeout, defaults.header_read_timeout) == (30.0, 10.0)


# -- (1b) request smuggling and oversized headers ---------------------------------------------------
def test_content_length_with_transfer_encoding_is_refused_and_closed(server):
    """CL.TE: a proxy that frames by Content-Length forwards the smuggled request inside the
    body; this server frames by Transfer-Encoding. Neither may read it (RFC 9112 section 6.3):
    400, and the connection is closed with nothing after it answered."""
    smuggled = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    body = b"0\r\n\r\n" + smuggled
    length = b"Content-Length: %d\r\n" % len(body)
    chunked = b"Transfer-Encoding: chunked\r\n"
    start = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    for framing in (length + chunked, chunked + length):
        reply = raw_exchange(server.port, [start + framing + b"\r\n" + body], limit=5.0)
        assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
        assert reply.count(b"HTTP/1.1 ") == 1, reply  # the smuggled request got no answer
        assert b"connection: close" in reply.lower()
        assert b"Transfer-Encoding" in reply  # the JSON body says why
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200


@pytest.mark.parametrize("size", [64 << 10, 1 << 20])
def test_oversized_headers_get_431(server, size):
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size + b"\r\n\r\n"
    reply = raw_exchange(server.port, [head], limit=10.0)
    assert reply.startswith(b"HTTP/1.1 431"), reply[:200]
    assert b"--max-header-bytes" in reply and b"16384" in reply
    assert b"connection: close" in reply.lower()
    within = {"X-Big": "a" * 8000}
    assert httpx.get(f"{server.url}/health", headers=within, timeout=5).status_code == 200


def test_header_limit_is_a_setting(llm, tiny_model_dir):
    settings = resolve_settings({"max_header_bytes": "4096"}, environ={})
    assert settings.max_header_bytes == 4096 and ServerSettings().max_header_bytes == 16384
    with ServerThread(
        create_app(llm, dataclasses.replace(settings, model=tiny_model_dir))
    ) as running:
        headers = {"X-Big": "a" * 5000}
        answer = httpx.get(f"{running.url}/health", headers=headers, timeout=5)
        assert answer.status_code == 431 and "4096" in answer.json()["error"]
        small = httpx.get(f"{running.url}/health", headers={"X-Big": "a" * 3000}, timeout=5)
        assert small.status_code == 200


# -- (2) streams cut short -------------------------------------------------------------------------
def test_drained_stream_ends_with_abort_and_no_done(llm, tiny_model_dir):
    app = create_app(llm, ServerSettings(model=tiny_model_dir))
    state = app.state.server
    payload = {"prompt": LONG_PROMPT, "max_tokens": 100, "ignore_eos": True, "stream": True}
    with ServerThread(app) as running, httpx.Client(base_url=running.url, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json=payload) as response:
            lines = response.iter_lines()
            first = next(line for line in lines if line.startswith("data:"))
            drain = asyncio.run_coroutine_threadsafe(state.drain(0.05), state.loop)
            events = sse_payloads([first, *lines])
        drain.result(timeout=30)
    assert "[DONE]" not in events
    assert events[-2]["choices"][0]["finish_reason"] == "abort"
    assert events[-1]["error"]["code"] == 503
    assert events[-1]["error"]["type"] == "service_unavailable"


def test_failed_step_ends_stream_with_error_and_no_done(server):
    payload = {"model": "tiny", "messages": [{"role": "user", "content": PROMPT}]}
    payload.update(max_tokens=50, stream=True, ignore_eos=True)
    restore = inject_fault(server.llm.engine.runner, times=1)
    try:
        with httpx.stream(
            "POST", f"{server.url}/v1/chat/completions", json=payload, timeout=120
        ) as response:
            events = sse_payloads(response.iter_lines())
    finally:
        restore()
    assert "[DONE]" not in events
    assert events[-2]["choices"][0]["finish_reason"] == "error"
    assert events[-1]["error"]["code"] == 500 and "injected fault" in events[-1]["error"]["message"]


# -- (3) model names, (4) content types ------------------------------------------------------------
def test_unknown_model_is_404(server, monkeypatch):
    for path, body in (
        ("/v1/completions", {"model": "nope", "prompt": PROMPT}),
        ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "x"}]}),
    ):
        answer = httpx.post(server.url + path, json=body, timeout=30)
        assert answer.status_code == 404
        assert answer.json()["error"]["code"] == "model_not_found"
        assert answer.json()["error"]["param"] == "model"
    # "dummy": what huggingface_hub's InferenceClient(base_url=...) sends; "tgi": TGI's placeholder
    for model in ("tiny", "tiny-alias", None, "dummy", "tgi"):
        body = {"prompt": PROMPT, "max_tokens": 2}
        if model is not None:
            body["model"] = model
        answer = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert answer.status_code == 200 and answer.json()["model"] == "tiny"
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # loopback only
    chat = InferenceClient(base_url=server.url).chat_completion(
        [{"role": "user", "content": "x"}], max_tokens=2
    )
    assert chat.choices[0].message.content is not None


@pytest.mark.parametrize("path", ["/generate", "/", "/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "multipart/form-data; boundary=x", "application/x-www-form-urlencoded"],
)
def test_non_json_content_type_is_415(server, path, content_type):
    before = steps(server.llm)
    body = b'{"inputs": "x", "model": "tiny", "prompt": "x"}'
    answer = httpx.post(
        server.url + path, content=body, headers={"content-type": content_type}, timeout=30
    )
    assert answer.status_code == 415 and "error" in answer.json()
    assert steps(server.llm) == before


def test_json_content_types_and_clients_are_accepted(server, monkeypatch):
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 2}}
    for content_type in ("application/json", "application/json; charset=utf-8", None):
        headers = {"content-type": content_type} if content_type else {}
        answer = httpx.post(
            server.url + "/generate", content=json.dumps(body), headers=headers, timeout=60
        )
        assert answer.status_code == 200, (content_type, answer.text)
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    assert oai.completions.create(model="tiny", prompt=PROMPT, max_tokens=2).choices[0].text
    with pytest.raises(openai.NotFoundError):
        oai.completions.create(model="nope", prompt=PROMPT, max_tokens=2)
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    hf = InferenceClient(base_url=server.url)
    assert hf.text_generation(PROMPT, max_new_tokens=2)


# -- (0) failed steps through the server -----------------------------------------------------------
def greedy_texts(url: str) -> list[str]:
    texts = []
    for prompt in (PROMPT, "Once upon a time", "Paris is"):
        body = {"inputs": prompt, "parameters": {"max_new_tokens": 8}}
        answer = httpx.post(url + "/generate", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        texts.append(answer.json()["generated_text"])
    return texts


def wait_idle(llm) -> dict:
    deadline = time.monotonic() + 20
    while True:
        stats = llm.stats()
        if stats["num_running"] == stats["num_waiting"] == stats["kv_pages_used"] == 0:
            return stats
        assert time.monotonic() < deadline, stats
        time.sleep(0.02)


def test_server_survives_one_failed_step(server):
    before = greedy_texts(server.url)
    failed_before = server.llm.stats()["failed_steps"]
    restore = inject_fault(server.llm.engine.runner, times=1)
    try:
        body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 8}}
        failed = httpx.post(server.url + "/generate", json=body, timeout=60)
    finally:
        restore()
    assert failed.status_code == 500 and "injected fault" in failed.json()["error"]
    assert greedy_texts(server.url) == before
    assert wait_idle(server.llm)["kv_pages_used"] == 0
    assert httpx.get(server.url + "/health").status_code == 200
    metrics = httpx.get(server.url + "/metrics").text
    assert f"jaxgen_engine_failed_steps_total {failed_before + 1}.0" in metrics


def test_dead_engine_fails_health_and_exits_nonzero(tiny_model_dir):
    llm = AsyncLLM(model=tiny_model_dir, **TINY_ENGINE_KNOBS)
    restore = inject_fault(llm.engine.runner, times=None)
    settings = ServerSettings(model=tiny_model_dir, drain_timeout=5)
    app = create_app(llm, settings)
    port = free_port()
    server = DrainingServer(
        uvicorn_config(app, settings, host="127.0.0.1", port=port, log_level="warning"),
        app.state.server,
        settings.drain_timeout,
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 4}}
        seen_unhealthy = False
        for _ in range(3):  # every step fails: the third in a row kills the engine
            answer = httpx.post(url + "/generate", json=body, timeout=60)
            assert answer.status_code in (500, 503)
            try:
                health = httpx.get(url + "/health", timeout=5)
            except httpx.ConnectError:
                # The engine died and, nothing being in flight, the drain closed the socket.
                assert server.should_exit and llm.dead is not None
                seen_unhealthy = True
                break
            if health.status_code == 503:
                assert health.json()["status"] == "failed" and health.json()["error"]
                seen_unhealthy = True
                try:
                    refused = httpx.post(url + "/generate", json=body, timeout=5)
                except httpx.ConnectError:
                    # Nothing was in flight, so the drain may already have closed the socket.
                    assert server.should_exit
                else:
                    assert refused.status_code == 503
                break
        assert seen_unhealthy and llm.dead is not None
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert server.exit_code == 1 == exit_code(app.state.server)
    finally:
        restore()
        server.should_exit = True
        thread.join(timeout=10)
        llm.shutdown()
