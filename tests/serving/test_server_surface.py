"""The rest of the OpenAI/TGI surface end to end (tiny model, real clients over loopback HTTP):
prompt logprobs through ``echo``, ``prompt_logprobs`` and ``decoder_input_details`` against
transformers fp32, ``logit_bias``, ``max_tokens`` omitted, ``/tokenize`` and ``/detokenize``, the
API key, CORS and ``X-Request-Id``."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from serving.app import create_app
from serving.settings.resolve import ServerSettings
from serving.testing import ServerThread

PROMPT = "The quick brown fox jumps over the lazy dog"
API_KEY = "sk-test-key"


@pytest.fixture(scope="module")
def locked(llm, tiny_model_dir):
    """A server with an API key, CORS for one origin and a small context (48 tokens)."""
    settings = ServerSettings(
        model=tiny_model_dir,
        served_model_name="tiny",
        api_key=API_KEY,
        allowed_origins=("https://app.example",),
        allow_credentials=True,
        max_total_tokens=48,
        max_input_tokens=40,
    )
    with ServerThread(create_app(llm, settings)) as running:
        yield running


@pytest.fixture(scope="module")
def reference(tiny_model_dir, llm):
    """transformers fp32 on the prompt as the server tokenizes it: (ids, [L - 1, V] logprobs)."""
    import torch
    import transformers

    ids = llm.tokenizer.encode(PROMPT, add_special_tokens=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model.eval()(torch.tensor([ids])).logits[0, :-1].float()
    return ids, torch.log_softmax(logits, dim=-1).numpy()


def test_echo_logprobs_match_transformers(oai, reference):
    ids, logprobs = reference
    out = oai.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=3, temperature=0, echo=True, logprobs=1
    )
    choice = out.choices[0]
    assert choice.text.startswith(PROMPT)
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) + 3
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for i in range(1, len(ids)):
        assert abs(lp.token_logprobs[i] - logprobs[i - 1, ids[i]]) < 1e-4
        # the most likely token and the prompt's own (one entry when they are the same)
        assert lp.tokens[i] in lp.top_logprobs[i] and 1 <= len(lp.top_logprobs[i]) <= 2
        assert abs(max(lp.top_logprobs[i].values()) - logprobs[i - 1].max()) < 1e-4
    assert lp.text_offset[0] == 0 and lp.text_offset[len(ids)] == len(PROMPT)
    streamed = list(
        oai.completions.create(
            model="tiny",
            prompt=PROMPT,
            max_tokens=3,
            temperature=0,
            echo=True,
            logprobs=1,
            stream=True,
        )
    )
    first = streamed[0].choices[0]
    assert first.text == PROMPT and first.logprobs.token_logprobs == lp.token_logprobs[: len(ids)]


def test_vllm_prompt_logprobs_field(oai, reference):
    ids, logprobs = reference
    out = oai.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=1, extra_body={"prompt_logprobs": 2}
    )
    entries = out.choices[0].model_extra["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(ids)
    for i in range(1, len(ids)):
        entry = entries[i][str(ids[i])]
        assert abs(entry["logprob"] - logprobs[i - 1, ids[i]]) < 1e-4
        ranks = sorted(e["rank"] for e in entries[i].values() if e["rank"] is not None)
        assert ranks[:2] == [1, 2]
    chat = oai.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=1,
        extra_body={"prompt_logprobs": 0},
    )
    chat_entries = chat.model_extra["prompt_logprobs"]
    assert chat_entries[0] is None and all(len(e) == 1 for e in chat_entries[1:])


def test_decoder_input_details_are_real(http, server, reference, monkeypatch):
    import huggingface_hub.constants
    from huggingface_hub import InferenceClient

    ids, logprobs = reference
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # loopback only
    client = InferenceClient(base_url=server.url)
    out = client.text_generation(PROMPT, max_new_tokens=2, details=True, decoder_input_details=True)
    assert [t.id for t in out.details.prefill] == ids
    assert abs(out.details.prefill[1].logprob - logprobs[0, ids[1]]) < 1e-4
    body = {
        "inputs": PROMPT,
        "parameters": {"max_new_tokens": 2, "details": True, "decoder_input_details": True},
    }
    response = http.post("/generate", json=body)
    assert response.status_code == 200, response.text
    prefill = response.json()["details"]["prefill"]
    assert [t["id"] for t in prefill] == ids and prefill[0]["logprob"] is None
    for i in range(1, len(ids)):
        assert abs(prefill[i]["logprob"] - logprobs[i - 1, ids[i]]) < 1e-4
    streamed = http.post("/generate_stream", json=body)
    assert streamed.status_code == 422 and "decoder_input_details" in streamed.json()["error"]


def test_logit_bias_and_stop_token_ids(oai, http):
    forced = oai.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=4, temperature=0, logit_bias={"777": 100}
    )
    assert forced.choices[0].logprobs is None
    assert forced.usage.completion_tokens == 4
    tokens = http.post("/tokenize", json={"prompt": forced.choices[0].text}).json()["tokens"]
    assert tokens == [777] * 4
    stopped = oai.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=4,
        temperature=0,
        logit_bias={"777": 100},
        extra_body={"stop_token_ids": [777]},
    )
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens == 1
    for bias, fragment in [
        ({"x": 1}, "keys"),
        ({"-3": 1}, "keys"),
        ({"10000000": 1}, "keys"),
        ({"5": 101}, "values"),
        ({"5": "1"}, "values"),
        ([5], "object"),
    ]:
        response = http.post("/v1/completions", json={"prompt": "a", "logit_bias": bias})
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == "logit_bias", bias
        assert fragment in error["message"]


def test_logit_bias_over_the_whole_vocabulary(http, llm):
    """A bias for every token of the vocabulary is a valid request (vLLM takes it): accepted,
    and applied (every token down but one)."""
    vocab = min(llm.model_config.vocab_size, len(llm.tokenizer))
    bias = {str(token): -100 for token in range(vocab)} | {"777": 100}
    answer = http.post(
        "/v1/completions",
        json={"prompt": PROMPT, "max_tokens": 3, "temperature": 1.0, "logit_bias": bias},
    )
    assert answer.status_code == 200, answer.text[:300]
    text = answer.json()["choices"][0]["text"]
    assert http.post("/tokenize", json={"prompt": text}).json()["tokens"] == [777] * 3
    beyond = http.post("/v1/completions", json={"prompt": "a", "logit_bias": {str(vocab): 1}})
    assert beyond.status_code == 400 and beyond.json()["error"]["param"] == "logit_bias"


def test_tokenize_detokenize_round_trip(http, llm):
    tokenized = http.post("/tokenize", json={"model": "tiny", "prompt": PROMPT}).json()
    assert tokenized["tokens"] == llm.tokenizer.encode(PROMPT, add_special_tokens=True)
    assert tokenized["count"] == len(tokenized["tokens"]) and tokenized["max_model_len"] > 0
    back = http.post("/detokenize", json={"tokens": tokenized["tokens"]}).json()
    assert back["prompt"].endswith(PROMPT)
    chat = http.post(
        "/tokenize",
        json={"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True},
    ).json()
    text = llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat["tokens"] == llm.tokenizer.encode(text, add_special_tokens=False)
    bad = http.post("/detokenize", json={"tokens": [-1]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_request_id_is_honoured_and_returned(http):
    response = http.post(
        "/v1/completions",
        json={"prompt": "a", "max_tokens": 1},
        headers={"X-Request-Id": "client-id-42"},
    )
    assert response.headers["x-request-id"] == "client-id-42"
    assert response.json()["id"] == "cmpl-client-id-42"
    health = http.get("/health")
    assert len(health.headers["x-request-id"]) == 32  # made when absent
    assert http.get("/nope").headers["x-request-id"]


def test_api_key_cors_and_room_left(locked):
    with httpx.Client(base_url=locked.url, timeout=120) as client:
        assert client.get("/health").status_code == 200
        assert client.get("/metrics").status_code == 200
        for path in ("/v1/models", "/tokenize", "/generate"):
            denied = client.post(path, json={}) if path != "/v1/models" else client.get(path)
            assert denied.status_code == 401, path
            error = denied.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
        wrong = openai.OpenAI(base_url=f"{locked.url}/v1", api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        preflight = client.options(
            "/v1/completions",
            headers={
                "Origin": "https://app.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type",
            },
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "https://app.example"
        assert preflight.headers["access-control-allow-credentials"] == "true"
        other = client.options(
            "/v1/completions",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
        )
        assert other.status_code == 400
    right = openai.OpenAI(base_url=f"{locked.url}/v1", api_key=API_KEY, max_retries=0)
    prompt = [1, 2, 3, 4, 5]
    out = right.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert out.usage.completion_tokens == 48 - out.usage.prompt_tokens  # the room left
    completion = right.completions.create(
        model="tiny", prompt=prompt, temperature=0, extra_body={"ignore_eos": True}
    )
    assert completion.usage.completion_tokens == 16  # completions default to 16, as vLLM


def test_cli_flags_and_environment():
    from serving.settings.resolve import resolve_settings

    settings = resolve_settings(
        {"allowed_origins": ['["https://a.example", "https://b.example"]']},
        {"VLLM_API_KEY": "k1"},
    )
    assert settings.api_key == "k1"
    assert settings.allowed_origins == ("https://a.example", "https://b.example")
    env = resolve_settings({}, {"JAXGEN_API_KEY": "k2", "VLLM_API_KEY": "k1"})
    assert env.api_key == "k2"
    assert json.dumps(resolve_settings({}, {}).allowed_methods) == '["*"]'
