"""The HTTP server's limits end to end: every limit named in its error, bad requests answered
with a JSON 4xx naming the parameter, and overload answered with 429 while every admitted
request completes."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import httpx
import pytest

from serving.app import create_app
from serving.settings.resolve import ServerSettings
from serving.testing import ServerThread
from tests.serving.server_checks import LONG_PROMPT, PROMPT, metric_value, sse_payloads, wait_idle


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


# -- admission, disconnects, draining ------------------------------------------------------------------
def test_overload_gives_429_while_admitted_complete(llm, tiny_model_dir):
    settings = ServerSettings(
        model=tiny_model_dir,
        max_concurrent_requests=2,
        max_waiting_requests=0,
        served_model_name="m",
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


def test_requests_past_the_limit_wait_for_a_slot_before_429(llm, tiny_model_dir):
    """One slot, two waiting places: of four requests at once the first runs, the next two
    wait and are answered in turn, the fourth is refused (429) at once."""
    settings = ServerSettings(
        model=tiny_model_dir,
        max_concurrent_requests=1,
        max_waiting_requests=2,
        served_model_name="m",
    )
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 200, "ignore_eos": True}
    with ServerThread(create_app(llm, settings)) as server:
        state = server.server.config.app.state.server

        def post(_):
            with httpx.Client(base_url=server.url, timeout=120) as client:
                return client.post("/v1/completions", json=body).status_code

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            first = pool.submit(post, 0)
            deadline = time.monotonic() + 30
            while state.in_flight < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            waiting = [pool.submit(post, i) for i in (1, 2)]
            while len(state.waiters) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            refused = post(3)
            statuses = [first.result(), *(f.result() for f in waiting)]
        assert refused == 429 and statuses == [200, 200, 200]
        assert state.in_flight == 0 and not state.waiters
    wait_idle(llm)
