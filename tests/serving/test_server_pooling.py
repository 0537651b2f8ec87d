"""The pooling routes: ``/v1/embeddings`` through the openai SDK (strings, token ids, base64,
``dimensions``, usage), vLLM's ``/pooling`` and ``/score``, Jina/Cohere's ``/rerank``, TEI's
``/embed``; and the 400s: a model with no pooling, generation asked of a pooling model, inputs
past ``max_model_len``, bad fields."""

from __future__ import annotations

import json
import os
import time

import httpx
import numpy as np
import pytest

from jaxgen import LLM
from serving.app import create_app
from serving.model_loading import build_llm
from serving.settings.resolve import ServerSettings, resolve_settings
from serving.testing import ServerThread
from tests.family_models import save_tiny_model
from tests.pooling.pooling_models import save_tiny_encoder, write_pooling_files

TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog", "a"]


def _serve(flags: dict):
    """A server loading ``flags["model"]`` as ``jaxgen serve`` would, once it is healthy."""
    settings = resolve_settings({"served_model_name": "m", **flags}, {})
    running = ServerThread(create_app(lambda: build_llm(settings), settings)).start()
    deadline = time.monotonic() + 300
    while httpx.get(f"{running.url}/health").status_code != 200:
        assert time.monotonic() < deadline, "the server did not load"
        time.sleep(0.2)
    return running


@pytest.fixture(scope="module")
def embedder_dir(tmp_path_factory, smollm2_tokenizer):
    path = save_tiny_model(str(tmp_path_factory.mktemp("embedder")), smollm2_tokenizer)
    write_pooling_files(path, "LAST")
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({**config, "is_matryoshka": True}, f)
    return path


@pytest.fixture(scope="module")
def server(embedder_dir):
    running = _serve({"model": embedder_dir, "task": "embed", "max_model_len": 64})
    yield running
    running.stop()


@pytest.fixture(scope="module")
def reference(embedder_dir):
    return LLM(embedder_dir, task="embed", max_model_len=64)


def test_openai_sdk_embeddings_equal_the_python_api(oai, reference):
    """The SDK asks for base64 and decodes it; strings and token ids alike."""
    expected = [o.outputs.embedding for o in reference.embed(TEXTS)]
    answer = oai.embeddings.create(model="m", input=TEXTS)
    np.testing.assert_allclose([d.embedding for d in answer.data], expected, atol=1e-6)
    assert [d.index for d in answer.data] == [0, 1, 2]
    tokens = [o.prompt_token_ids for o in reference.embed(TEXTS)]
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == sum(map(len, tokens))
    by_ids = oai.embeddings.create(model="m", input=tokens[1])
    np.testing.assert_allclose(by_ids.data[0].embedding, expected[1], atol=1e-6)
    short = oai.embeddings.create(model="m", input="Hello world", dimensions=16)
    assert len(short.data[0].embedding) == 16
    assert abs(np.linalg.norm(short.data[0].embedding) - 1) < 1e-5


def test_float_encoding_and_the_other_shapes(http, reference):
    expected = [o.outputs.embedding for o in reference.embed(TEXTS)]
    body = http.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "float"}).json()
    assert body["object"] == "list" and body["model"] == "m"
    np.testing.assert_allclose([d["embedding"] for d in body["data"]], expected, atol=1e-6)
    pooled = http.post("/pooling", json={"input": TEXTS}).json()
    np.testing.assert_allclose([d["data"] for d in pooled["data"]], expected, atol=1e-6)
    tei = http.post("/embed", json={"inputs": TEXTS}).json()
    np.testing.assert_allclose(tei, expected, atol=1e-6)
    scored = http.post("/score", json={"text_1": TEXTS[0], "text_2": TEXTS[1:]}).json()
    cosines = [float(np.dot(expected[0], e)) for e in expected[1:]]
    np.testing.assert_allclose([d["score"] for d in scored["data"]], cosines, atol=1e-6)


@pytest.mark.parametrize(
    "body,param",
    [
        ({"input": 5}, "input"),
        ({"input": ["ok", ""]}, "input"),
        ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": [[1, 2, 10**9]]}, "input[0]"),
    ],
)
def test_bad_fields_are_400s_naming_the_field(http, body, param):
    answer = http.post("/v1/embeddings", json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


def test_input_past_max_model_len_is_a_400_naming_the_limit(http):
    answer = http.post("/v1/embeddings", json={"input": [list(range(1, 70))]})
    assert answer.status_code == 400
    assert "max_model_len) of 64" in answer.json()["error"]["message"]


def test_generation_asked_of_a_pooling_model_is_a_400(http):
    chat = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", {"prompt": "Hi"})):
        answer = http.post(path, json=body)
        assert answer.status_code == 400, answer.text
        assert "pooling model" in answer.json()["error"]["message"]


def test_a_generation_model_without_pooling_refuses_embeddings(llm, tiny_model_dir):
    settings = ServerSettings(model=tiny_model_dir, served_model_name="tiny")
    with ServerThread(create_app(llm, settings)) as running:
        answer = httpx.post(f"{running.url}/v1/embeddings", json={"input": "Hi"}, timeout=60)
    assert answer.status_code == 400
    assert "no pooling defined" in answer.json()["error"]["message"]


def test_rerank_with_a_cross_encoder(tmp_path):
    path = save_tiny_encoder(str(tmp_path), "bert", num_labels=1, seed=5)
    query, documents = "what is the capital of france", ["paris is a city", "the dog", "a river"]
    expected = [o.outputs.score for o in LLM(path).score(query, documents)]
    running = _serve({"model": path})  # a sequence classifier scores by default
    try:
        for route in ("/rerank", "/v1/rerank"):
            body = {
                "query": query,
                "documents": [documents[0], {"text": documents[1]}, documents[2]],
            }
            answer = httpx.post(f"{running.url}{route}", json={**body, "top_n": 2}, timeout=60)
            results = answer.json()["results"]
            order = list(np.argsort(expected)[::-1][:2])
            assert [r["index"] for r in results] == order
            np.testing.assert_allclose(
                [r["relevance_score"] for r in results], [expected[i] for i in order], atol=1e-6
            )
            assert results[0]["document"]["text"] == documents[order[0]]
        scored = httpx.post(f"{running.url}/score", json={"text_1": query, "text_2": documents})
        np.testing.assert_allclose([d["score"] for d in scored.json()["data"]], expected, atol=1e-6)
        refused = httpx.post(f"{running.url}/rerank", json={"query": query, "documents": []})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "documents"
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        answer = httpx.post(f"{running.url}/v1/chat/completions", json=chat, timeout=60)
        assert answer.status_code == 400, answer.text
        assert "pooling model" in answer.json()["error"]["message"], answer.text
    finally:
        running.stop()


def test_a_generation_model_with_a_pooler_embeds_beside_generation(embedder_dir, reference):
    """No ``--task``: the server generates, and its first embeddings requests (concurrent) share
    one pooling engine built off the event loop; /health answers meanwhile."""
    import concurrent.futures

    running = _serve({"model": embedder_dir, "max_model_len": 64})
    try:
        url = f"{running.url}/v1/embeddings"
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            answers = list(
                pool.map(lambda text: httpx.post(url, json={"input": text}, timeout=120), TEXTS)
            )
            health = httpx.get(f"{running.url}/health", timeout=30)
        assert health.status_code == 200
        expected = [o.outputs.embedding for o in reference.embed(TEXTS)]
        for answer, embedding in zip(answers, expected, strict=True):
            assert answer.status_code == 200, answer.text
            np.testing.assert_allclose(answer.json()["data"][0]["embedding"], embedding, atol=1e-5)
        chat = httpx.post(
            f"{running.url}/v1/completions",
            json={"prompt": "Hello", "max_tokens": 2, "temperature": 0},
            timeout=60,
        )
        assert chat.status_code == 200, chat.text
    finally:
        running.stop()


def test_embeddings_of_a_modernbert_embedder(tmp_path):
    """A rotary encoder with sliding-window layers (window 8) behind ``/v1/embeddings``: the
    Python API's vectors, inputs past the window included."""
    fields = dict(num_hidden_layers=3, global_attn_every_n_layers=2, local_attention=8)
    path = save_tiny_encoder(str(tmp_path), "modernbert", seed=6, **fields)
    write_pooling_files(path, "MEAN")
    texts = [*TEXTS, " ".join(["the quick brown fox"] * 6)]
    expected = [o.outputs.embedding for o in LLM(path).embed(texts)]
    running = _serve({"model": path})  # an encoder embeds by default
    try:
        answer = httpx.post(f"{running.url}/v1/embeddings", json={"input": texts}, timeout=60)
        assert answer.status_code == 200, answer.text
        got = [d["embedding"] for d in answer.json()["data"]]
        np.testing.assert_allclose(got, expected, atol=1e-6)
    finally:
        running.stop()
