"""Multi-LoRA over HTTP: ``--lora-modules`` adapters as OpenAI models (listed with their
parent), each answering with its own tokens (transformers + peft's), loaded and unloaded while
serving behind the API key, bad adapters a 400 naming them."""

from __future__ import annotations

import httpx
import pytest

from jaxgen.async_llm import AsyncLLM
from serving.app import create_app
from serving.lora_adapters import parse_lora_modules
from serving.settings.parsers import SettingsError
from serving.settings.resolve import ServerSettings, resolve_settings
from serving.testing import TINY_ENGINE_KNOBS, ServerThread
from tests.lora.peft_adapters import peft_greedy, save_adapter

KEY = {"Authorization": "Bearer secret"}
PROMPT = [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def lora_server(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("server-lora")
    adapters = {
        n: save_adapter(tiny_model_dir, str(root / n), seed=s, r=4) for n, s in (("a", 1), ("b", 2))
    }
    llm = AsyncLLM(
        tiny_model_dir, enable_lora=True, max_loras=2, max_lora_rank=4, **TINY_ENGINE_KNOBS
    )
    settings = ServerSettings(
        model=tiny_model_dir,
        served_model_name="tiny",
        api_key="secret",
        lora_modules=(("sql", adapters["a"]),),
    )
    with ServerThread(create_app(llm, settings)) as running:
        running.adapters = adapters
        yield running
    llm.shutdown()


def _complete(server, model: str) -> httpx.Response:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    return httpx.post(f"{server.url}/v1/completions", json=body, headers=KEY, timeout=120)


def test_adapters_are_models_with_their_own_tokens(lora_server, tiny_model_dir):
    models = httpx.get(f"{lora_server.url}/v1/models", headers=KEY).json()["data"]
    assert [(m["id"], m["parent"]) for m in models] == [("tiny", None), ("sql", "tiny")]
    base, sql = _complete(lora_server, "tiny"), _complete(lora_server, "sql")
    assert base.status_code == sql.status_code == 200, (base.text, sql.text)
    assert sql.json()["model"] == "sql"
    want = peft_greedy(tiny_model_dir, lora_server.adapters["a"], PROMPT, 4, merged=True)[0]
    want_base = peft_greedy(tiny_model_dir, None, PROMPT, 4, merged=True)[0]
    assert base.json()["choices"][0]["text"] != sql.json()["choices"][0]["text"]
    from transformers import AutoTokenizer

    decode = AutoTokenizer.from_pretrained(tiny_model_dir).decode
    assert sql.json()["choices"][0]["text"] == decode(want)
    assert base.json()["choices"][0]["text"] == decode(want_base)


def test_tgi_adapter_id_picks_the_adapter(lora_server):
    """TGI's ``parameters.adapter_id``: the adapter's tokens (as the OpenAI route's with that
    ``model``), the served name or none for the base model, an unknown one a 422 naming it."""
    text = "The sea is deep and"

    def tgi(path, **parameters):
        body = {"inputs": text, "parameters": {"max_new_tokens": 4, **parameters}}
        return httpx.post(f"{lora_server.url}{path}", json=body, headers=KEY, timeout=120)

    def openai(model):
        body = {"model": model, "prompt": text, "max_tokens": 4, "temperature": 0}
        answer = httpx.post(
            f"{lora_server.url}/v1/completions", json=body, headers=KEY, timeout=120
        )
        return answer.json()["choices"][0]["text"]

    sql, base = tgi("/generate", adapter_id="sql"), tgi("/generate", adapter_id="tiny")
    assert sql.status_code == base.status_code == 200, (sql.text, base.text)
    assert sql.json()["generated_text"] == openai("sql")
    assert (
        base.json()["generated_text"] == tgi("/generate").json()["generated_text"] == openai("tiny")
    )
    assert sql.json()["generated_text"] != base.json()["generated_text"]
    streamed = tgi("/generate_stream", adapter_id="sql")
    assert streamed.status_code == 200
    assert sql.json()["generated_text"] in streamed.text
    unknown = tgi("/generate", adapter_id="nope")
    assert unknown.status_code == 422, unknown.text
    assert "parameters.adapter_id" in unknown.json()["error"] and "sql" in unknown.json()["error"]


def test_load_and_unload_while_serving(lora_server, tiny_model_dir):
    url = lora_server.url
    body = {"lora_name": "b", "lora_path": lora_server.adapters["b"]}
    assert httpx.post(f"{url}/v1/load_lora_adapter", json=body).status_code == 401  # the key
    loaded = httpx.post(f"{url}/v1/load_lora_adapter", json=body, headers=KEY)
    assert loaded.status_code == 200, loaded.text
    assert httpx.get(f"{url}/v1/models/b", headers=KEY).json()["parent"] == "tiny"
    answer = _complete(lora_server, "b")
    assert answer.status_code == 200 and answer.json()["model"] == "b"
    again = httpx.post(f"{url}/v1/load_lora_adapter", json=body, headers=KEY)
    assert again.status_code == 400 and "already" in again.json()["error"]["message"]
    gone = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "b"}, headers=KEY)
    assert gone.status_code == 200, gone.text
    assert _complete(lora_server, "b").status_code == 404
    missing = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "b"}, headers=KEY)
    assert missing.status_code == 404


def test_bad_adapter_is_a_400_naming_it(lora_server, tmp_path):
    url = lora_server.url
    body = {"lora_name": "nope", "lora_path": str(tmp_path / "missing")}
    response = httpx.post(f"{url}/v1/load_lora_adapter", json=body, headers=KEY)
    assert response.status_code == 400
    assert "nope" in response.json()["error"]["message"]
    models = httpx.get(f"{url}/v1/models", headers=KEY).json()["data"]
    assert "nope" not in [m["id"] for m in models]
    assert _complete(lora_server, "nope").status_code == 404


def test_lora_modules_setting():
    settings = resolve_settings({"lora_modules": ["a=/x", "b=/y"]}, environ={})
    assert settings.lora_modules == (("a", "/x"), ("b", "/y"))
    assert parse_lora_modules("a=/x,b=/y") == (("a", "/x"), ("b", "/y"))
    with pytest.raises(SettingsError, match="name=path"):
        parse_lora_modules(["a"])
