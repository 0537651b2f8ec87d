"""``use_beam_search`` (vLLM's extra parameter) on the OpenAI completion and chat routes, on the
tiny random Llama: the best ``n`` beams of a reference beam search, and 400s naming the field."""

from __future__ import annotations

import pytest

from serving.app import create_app
from serving.settings.resolve import ServerSettings
from serving.testing import TINY_ENGINE_KNOBS, ServerThread, shared_llm
from tests.api.test_beam_search import reference_beam_search


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


def test_chat_beams(http):
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Hello"}],
        "max_completion_tokens": 3,
        "n": 2,
        "use_beam_search": True,
    }
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"]) == 2


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"temperature": 0.7}, "temperature"),
        ({"stream": True}, "stream"),
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
