"""``use_beam_search`` (vLLM's extra parameter) on the OpenAI completion and chat routes, on the
tiny random Llama: the best ``n`` beams of a reference beam search, and 400s naming the field."""

from __future__ import annotations

import pytest

from serving.app import create_app
from serving.settings.resolve import ServerSettings
from serving.testing import TINY_ENGINE_KNOBS, ServerThread, shared_llm
from tests.api.test_beam_search import reference_beam_search
from tests.serving.server_checks import sse_payloads


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    llm = shared_llm(tiny_model_dir, **TINY_ENGINE_KNOBS)
    settings = ServerSettings(model=tiny_model_dir, served_model_name="tiny")
    with ServerThread(create_app(llm, settings)) as running:
        running.llm = llm
        yield running


def test_completion_beams_match_reference(http, server, tiny_model_dir, smollm2_tokenizer):
    import torch
    import transformers

    prompt = "The quick brown fox jumps over"
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 5, "n": 2, "best_of": 3}
    response = http.post("/v1/completions", json={**body, "use_beam_search": True})
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32
    ).eval()
    ids = smollm2_tokenizer.encode(prompt, add_special_tokens=True)
    eos = set(server.llm.model_config.eos_token_ids)
    expected = reference_beam_search(model, ids, 3, 5, 1.0, eos, False)[:2]
    texts = [smollm2_tokenizer.decode(t[len(ids) :], skip_special_tokens=True) for t, _ in expected]
    assert [c["text"] for c in choices] == texts
    assert response.json()["usage"]["completion_tokens"] == sum(
        len(t) - len(ids) for t, _ in expected
    )


CHAT_BEAMS = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "Hello"}],
    "max_completion_tokens": 3,
    "n": 2,
    "use_beam_search": True,
}


def test_chat_beams(http):
    body = CHAT_BEAMS
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"]) == 2


def streamed(http, path: str, body: dict) -> list:
    with http.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return sse_payloads(response.iter_lines())


def test_completion_beams_stream(http):
    """As vLLM streams beam search: once the search ends, one chunk per choice (its whole text
    and finish reason), the usage chunk with ``include_usage``, then ``[DONE]``."""
    body = {
        "model": "tiny",
        "prompt": ["The quick brown fox jumps over", "Hello"],
        "max_tokens": 5,
        "n": 2,
        "best_of": 3,
        "use_beam_search": True,
    }
    whole = http.post("/v1/completions", json=body).json()
    events = streamed(http, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]
    assert all(len(c["choices"]) == 1 and c["usage"] is None for c in chunks)
    choices = sorted((c["choices"][0] for c in chunks), key=lambda c: c["index"])
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    for got, expected in zip(choices, whole["choices"], strict=True):
        assert got["text"] == expected["text"]
        assert got["finish_reason"] == expected["finish_reason"]
        assert got["finish_reason"] in ("stop", "length")


def test_chat_beams_stream(http):
    body = CHAT_BEAMS
    whole = http.post("/v1/chat/completions", json=body).json()
    events = streamed(http, "/v1/chat/completions", body)
    assert events[-1] == "[DONE]"
    roles = [c for c in events[:-1] if c["choices"][0]["delta"].get("role")]
    assert [c["choices"][0]["index"] for c in roles] == [0, 1]
    finals = [c["choices"][0] for c in events[:-1] if c["choices"][0]["finish_reason"]]
    assert sorted(c["index"] for c in finals) == [0, 1]
    for final in finals:
        expected = whole["choices"][final["index"]]
        content = "".join(
            c["choices"][0]["delta"].get("content") or ""
            for c in events[:-1]
            if c["choices"][0]["index"] == final["index"]
        )
        assert content == expected["message"]["content"]
        assert final["finish_reason"] == expected["finish_reason"]


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"temperature": 0.7}, "temperature"),
        ({"stream": True, "logprobs": 1}, "logprobs"),
        ({"best_of": 1, "n": 2}, "best_of"),
        ({"best_of": 11}, "best_of"),
        ({"logprobs": 2}, "logprobs"),
        ({"stop": ["x"]}, "stop"),
        ({"top_p": 0.5}, "top_p"),
        ({"length_penalty": 1e308}, "length_penalty"),
        ({"use_beam_search": "yes"}, "use_beam_search"),
    ],
)
def test_beam_search_refuses_what_it_cannot_honour(http, server, extra, param):
    body = {"model": "tiny", "prompt": "Hi", "max_tokens": 2, "use_beam_search": True, **extra}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert server.llm.num_unfinished == 0
