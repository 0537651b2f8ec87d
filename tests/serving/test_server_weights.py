"""Sleep mode and new weights over HTTP (``serving/admin_routes.py``), behind the API key:
vLLM's ``/sleep``, ``/wake_up``, ``/is_sleeping`` and SGLang's ``/update_weights_from_disk``;
generation while asleep is a 503 with ``Retry-After``, sleeping with requests in flight a 409
(they finish), bad checkpoints a 400 that keeps the old weights."""

from __future__ import annotations

import httpx
import pytest

from jaxgen import LLM, SamplingParams
from jaxgen.async_llm import AsyncLLM
from serving.app import create_app
from serving.settings.resolve import ServerSettings
from serving.testing import TINY_ENGINE_KNOBS, ServerThread
from tests.family_models import save_tiny_model

KEY = {"Authorization": "Bearer secret"}
PROMPT = [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    llm = AsyncLLM(tiny_model_dir, **TINY_ENGINE_KNOBS)  # its own: it will sleep
    settings = ServerSettings(model=tiny_model_dir, served_model_name="tiny", api_key="secret")
    with ServerThread(create_app(llm, settings)) as running:
        with httpx.Client(base_url=running.url, headers=KEY, timeout=120) as client:
            running.client = client
            yield running
    llm.shutdown()


@pytest.fixture(scope="module")
def other_checkpoint(tmp_path_factory, smollm2_tokenizer):
    return save_tiny_model(str(tmp_path_factory.mktemp("tiny-seed1")), smollm2_tokenizer, seed=1)


def complete(client: httpx.Client) -> httpx.Response:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 6, "temperature": 0}
    return client.post("/v1/completions", json=body)


def text_of(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def test_the_routes_need_the_api_key(server):
    for method, path in (("POST", "/sleep"), ("POST", "/wake_up"), ("GET", "/is_sleeping")):
        response = httpx.request(method, f"{server.url}{path}")
        assert response.status_code == 401, path
    response = httpx.post(f"{server.url}/update_weights_from_disk", json={"model_path": "x"})
    assert response.status_code == 401


def test_asleep_generation_gets_503_with_retry_after_until_wake_up(server):
    client = server.client
    before = text_of(complete(client))
    assert client.post("/sleep", params={"level": 1}).status_code == 200
    assert client.get("/is_sleeping").json() == {"is_sleeping": True}
    refused = complete(client)
    assert refused.status_code == 503 and int(refused.headers["retry-after"]) > 0
    assert "sleeping" in refused.json()["error"]["message"]
    tgi = client.post("/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 2}})
    assert tgi.status_code == 503 and "retry-after" in tgi.headers
    assert client.post("/tokenize", json={"prompt": "Hi"}).status_code == 200  # no weights
    assert httpx.get(f"{server.url}/health").status_code == 200  # the server is up
    again = client.post("/sleep")
    assert again.status_code == 409 and "asleep already" in again.json()["error"]["message"]
    assert client.post("/wake_up").status_code == 200
    assert client.get("/is_sleeping").json() == {"is_sleeping": False}
    assert text_of(complete(client)) == before
    twice = client.post("/wake_up")
    assert twice.status_code == 409 and "awake" in twice.json()["error"]["message"]


def test_level_2_then_weights_from_disk_then_wake_up(server, other_checkpoint):
    client = server.client
    before = text_of(complete(client))
    assert client.post("/sleep", params={"level": 2}).status_code == 200
    early = client.post("/wake_up")
    assert early.status_code == 409 and "update_weights" in early.json()["error"]["message"]
    answer = client.post("/update_weights_from_disk", json={"model_path": other_checkpoint})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"success": True, "message": "Succeeded to update model weights."}
    assert client.get("/is_sleeping").json() == {"is_sleeping": True}  # the pool sleeps on
    assert client.post("/wake_up", params={"tags": "kv_cache"}).status_code == 200
    new = text_of(complete(client))
    offline = LLM(other_checkpoint, **TINY_ENGINE_KNOBS)
    greedy = SamplingParams(max_tokens=6, temperature=0)
    assert new == offline.generate([PROMPT], greedy, use_tqdm=False)[0].text != before


def test_bad_requests_are_4xx_and_keep_the_weights(server, tmp_path, smollm2_tokenizer):
    client = server.client
    before = text_of(complete(client))
    for level in ("3", "x", "0"):
        bad = client.post("/sleep", params={"level": level})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "level"
    bad_tags = client.post("/wake_up", params={"tags": "bogus"})
    assert bad_tags.status_code == 400 and bad_tags.json()["error"]["param"] == "tags"
    narrow = save_tiny_model(str(tmp_path / "narrow"), smollm2_tokenizer, hidden_size=32)
    for body in (
        {},
        {"model_path": 3},
        {"model_path": str(tmp_path / "none")},
        {"model_path": narrow},
    ):
        answer = client.post("/update_weights_from_disk", json=body)
        assert answer.status_code == 400 and answer.json()["success"] is False, body
    assert "embed_tokens.embedding" in answer.json()["message"]
    assert text_of(complete(client)) == before


def test_sleep_is_refused_while_a_request_streams(server):
    client = server.client
    body = {"inputs": "Once", "parameters": {"max_new_tokens": 40}}
    with client.stream("POST", "/generate_stream", json=body) as stream:
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        busy = client.post("/sleep")
        assert busy.status_code == 409 and "in flight" in busy.json()["error"]["message"]
        rest = [line for line in lines if line.startswith("data:")]
    assert '"generated_text":"' in rest[-1].replace(" ", "")  # the request finished
    assert client.get("/is_sleeping").json() == {"is_sleeping": False}
