"""vLLM's ``priority`` request field on a server started with ``--scheduling-policy priority``
(tiny model): completions, chat, the chat batch and Responses take it; anything but an integer is
a 400 naming it (streamed requests too, before any event); a server scheduling first come, first
served refuses a non-zero one; ``jaxgen run-batch`` reads it from a line's body; ``AsyncLLM``
refuses a bad one before queueing."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from jaxgen.sampling_params import SamplingParams
from serving.app import create_app
from serving.launch.run_batch import run_batch_async
from serving.settings.resolve import ServerSettings
from serving.testing import TINY_ENGINE_KNOBS, ServerThread, shared_llm
from tests.serving.server_checks import PROMPT, engine_output, wait_idle

MESSAGES = [{"role": "user", "content": "Say something nice"}]
ROUTES = {
    "/v1/completions": {"prompt": PROMPT, "max_tokens": 3},
    "/v1/chat/completions": {"messages": MESSAGES, "max_tokens": 3},
    "/v1/responses": {"input": "Say something nice", "max_output_tokens": 3},
}


@pytest.fixture(scope="module")
def priority_llm(tiny_model_dir):
    return shared_llm(tiny_model_dir, **TINY_ENGINE_KNOBS, scheduling_policy="priority")


@pytest.fixture(scope="module")
def server(priority_llm, tiny_model_dir):
    settings = ServerSettings(model=tiny_model_dir, served_model_name="tiny")
    with ServerThread(create_app(priority_llm, settings)) as running:
        yield running


def test_every_route_takes_a_priority(http, priority_llm):
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "priority": -3}
    answer = http.post("/v1/completions", json=body)
    assert answer.status_code == 200, answer.text
    text, _ = engine_output(priority_llm, PROMPT, max_tokens=6, temperature=0)
    assert answer.json()["choices"][0]["text"] == text
    for path, body in ROUTES.items():
        answer = http.post(path, json={**body, "priority": 2})
        assert answer.status_code == 200, (path, answer.text)
    batch = {"messages": [MESSAGES, MESSAGES], "max_tokens": 2, "priority": 1}
    answer = http.post("/v1/chat/completions/batch", json=batch)
    assert answer.status_code == 200 and len(answer.json()["choices"]) == 2
    wait_idle(priority_llm)


@pytest.mark.parametrize("bad", ["1", 1.5, True, [1], {"p": 1}])
@pytest.mark.parametrize("path", list(ROUTES))
def test_a_priority_that_is_no_integer_is_a_400_naming_it(http, priority_llm, path, bad):
    for stream in (False, True):
        answer = http.post(path, json={**ROUTES[path], "priority": bad, "stream": stream})
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["param"] == "priority" and "`priority` must be an integer" in error["message"]
    wait_idle(priority_llm)


def test_a_fcfs_server_refuses_a_non_zero_priority(llm, tiny_model_dir):
    settings = ServerSettings(model=tiny_model_dir, served_model_name="tiny")
    with ServerThread(create_app(llm, settings)) as running:
        with httpx.Client(base_url=running.url, timeout=120) as client:
            for path, body in ROUTES.items():
                for stream in (False, True):
                    answer = client.post(path, json={**body, "priority": 1, "stream": stream})
                    assert answer.status_code == 400, answer.text
                    error = answer.json()["error"]
                    assert error["param"] == "priority"
                    assert "needs scheduling_policy='priority'" in error["message"]
                answer = client.post(path, json={**body, "priority": 0})
                assert answer.status_code == 200, answer.text
    wait_idle(llm)


def test_async_llm_refuses_a_bad_priority_before_queueing(priority_llm, llm):
    async def first(engine, priority):
        async for out in engine.generate(PROMPT, SamplingParams(max_tokens=2), priority=priority):
            return out

    with pytest.raises(ValueError, match="priority must be an int, got True"):
        asyncio.run(first(priority_llm, True))
    with pytest.raises(ValueError, match="priority 2 needs scheduling_policy='priority'"):
        asyncio.run(first(llm, 2))
    assert wait_idle(priority_llm)["num_waiting"] == 0
    assert asyncio.run(first(priority_llm, -1)) is not None


def test_run_batch_reads_each_lines_priority(priority_llm, tiny_model_dir, tmp_path):
    def line(custom_id: str, **body) -> str:
        body = {"prompt": PROMPT, "max_tokens": 2, **body}
        return json.dumps({"custom_id": custom_id, "url": "/v1/completions", "body": body})

    requests = tmp_path / "requests.jsonl"
    lines = [line("urgent", priority=-1), line("later", priority=3), line("bad", priority="hi")]
    requests.write_text("\n".join([*lines, line("plain")]) + "\n")
    results = tmp_path / "results.jsonl"
    settings = ServerSettings(model=tiny_model_dir)
    summary = asyncio.run(
        run_batch_async(priority_llm, settings, str(requests), str(results), progress=False)
    )
    assert (summary.requests, summary.errors) == (4, 1)
    out = {o["custom_id"]: o for o in map(json.loads, results.read_text().splitlines())}
    assert out["bad"]["response"]["status_code"] == 400
    assert "`priority`" in out["bad"]["error"]["message"]
    for custom_id in ("urgent", "later", "plain"):
        assert out[custom_id]["response"]["status_code"] == 200 and out[custom_id]["error"] is None
