"""Structured output over HTTP with real clients: OpenAI ``response_format`` and vLLM's
``structured_outputs`` on completions and chat (streamed and not), TGI's ``grammar`` through
``huggingface_hub.InferenceClient``, and the refusals (400 naming the field, server still up)."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest
from huggingface_hub import InferenceClient

from serving.app import create_app
from serving.settings.resolve import ServerSettings
from serving.testing import TINY_ENGINE_KNOBS, ServerThread, shared_llm
from tests.serving.hostile_constraints import grammar_chain, optional_properties

ORDER = {
    "type": "object",
    "properties": {
        "customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 10},
                "tier": {"enum": ["gold", "silver", "bronze"]},
            },
            "required": ["name", "tier"],
            "additionalProperties": False,
        },
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 9},
                    # multipleOf bounds the fraction's digits (a sampled model may not stop them)
                    "price": {"type": "number", "minimum": 0, "maximum": 100, "multipleOf": 0.25},
                },
                "required": ["sku", "quantity"],
                "additionalProperties": False,
            },
            "minItems": 1,
            "maxItems": 2,
        },
        "express": {"type": "boolean"},
    },
    "required": ["customer", "items"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "order", "schema": ORDER, "strict": True},
}
MESSAGES = [{"role": "user", "content": "Write an order as JSON."}]


@pytest.fixture(scope="module", params=["tiny", pytest.param("default", marks=pytest.mark.slow)])
def server(request, tiny_model_dir):
    """The tiny model (random weights, the default model's tokenizer) by default; the default
    model itself in the slow run (the grammar guarantees the format whatever the weights)."""
    if request.param == "tiny":
        llm = shared_llm(tiny_model_dir, **TINY_ENGINE_KNOBS)
        settings = ServerSettings(model=tiny_model_dir, served_model_name="tiny")
    else:
        llm = shared_llm(None, max_model_len=512, max_rolling_batch_size=32)
        settings = ServerSettings(served_model_name="tiny")
    with ServerThread(create_app(llm, settings)) as running:
        yield running


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_json_schema_chat_sampled_and_streamed(oai):
    """20 sampled chat requests at temperature 1 (10 streamed) all give schema-valid JSON."""
    response = oai.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        response_format=RESPONSE_FORMAT,
        temperature=1.0,
        max_completion_tokens=150,
        n=10,
        seed=1,
    )
    texts = [choice.message.content for choice in response.choices]
    assert all(choice.finish_reason == "stop" for choice in response.choices)
    stream = oai.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        response_format=RESPONSE_FORMAT,
        temperature=1.0,
        max_completion_tokens=150,
        n=10,
        seed=2,
        stream=True,
    )
    streamed = [""] * 10
    reasons = [None] * 10
    for chunk in stream:
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
            reasons[choice.index] = choice.finish_reason or reasons[choice.index]
    assert reasons == ["stop"] * 10
    for text in texts + streamed:
        jsonschema.validate(json.loads(text), ORDER)
    assert len(set(texts + streamed)) > 1


def test_relaxed_keywords_are_named_in_a_header(server):
    """A schema llguidance cannot wholly enforce runs, and its response (streamed too) names
    what was left out; one enforced whole has no such header."""
    schema = {"type": "array", "items": {"enum": [1, 2, 3]}, "maxItems": 2, "uniqueItems": True}
    body = {"prompt": "x", "max_tokens": 12, "structured_outputs": {"json": schema}}
    with httpx.Client(base_url=server.url, timeout=120) as http:
        answer = http.post("/v1/completions", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-structured-output-relaxed"] == "uniqueItems"
        with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as stream:
            assert stream.headers["x-structured-output-relaxed"] == "uniqueItems"
        body["structured_outputs"] = {"json": {"enum": [1, 2, 3]}}
        assert "x-structured-output-relaxed" not in http.post("/v1/completions", json=body).headers


def test_regex_choice_and_json_object_on_completions(oai):
    regex = oai.completions.create(
        model="tiny",
        prompt="A phone number:",
        max_tokens=30,
        temperature=1.0,
        extra_body={"structured_outputs": {"regex": r"\+1-[0-9]{3}-[0-9]{4}"}},
    )
    assert re.fullmatch(r"\+1-[0-9]{3}-[0-9]{4}", regex.choices[0].text)
    choice = oai.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Pick a colour."}],
        max_completion_tokens=10,
        extra_body={"structured_outputs": {"choice": ["cyan", "magenta", "yellow"]}},
    )
    assert choice.choices[0].message.content in ("cyan", "magenta", "yellow")
    assert choice.choices[0].finish_reason == "stop"
    streamed = oai.completions.create(
        model="tiny",
        prompt="JSON:",
        max_tokens=40,
        temperature=0.0,
        extra_body={  # items bounded, so the random model's array always completes
            "structured_outputs": {
                "json": {
                    "type": "array",
                    "maxItems": 2,
                    "items": {"type": "integer", "minimum": 0, "maximum": 9},
                }
            }
        },
        stream=True,
    )
    text = "".join(chunk.choices[0].text for chunk in streamed)
    assert isinstance(json.loads(text), list) and len(json.loads(text)) <= 2
    any_object = oai.completions.create(
        model="tiny",
        prompt="JSON:",
        max_tokens=60,
        temperature=0.0,
        extra_body={"response_format": {"type": "json_object"}},  # on completions too (vLLM)
    )
    if any_object.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(any_object.choices[0].text), dict)
    else:
        assert any_object.choices[0].text.startswith("{")


def test_inference_client_grammar_json(server, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    client = InferenceClient(base_url=server.url)
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 8},
            "zip": {"type": "integer", "minimum": 10000, "maximum": 99999},
        },
        "required": ["city", "zip"],
        "additionalProperties": False,
    }
    text = client.text_generation(
        "Address:", max_new_tokens=60, grammar={"type": "json", "value": schema}
    )
    jsonschema.validate(json.loads(text), schema)
    streamed = "".join(
        client.text_generation(
            "Code:", max_new_tokens=20, stream=True, grammar={"type": "regex", "value": "[a-f]{6}"}
        )
    )
    assert re.fullmatch("[a-f]{6}", streamed)


BAD_OPENAI = [
    (  # not valid JSON Schema
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": 5}},
            }
        },
        "response_format",
    ),
    (  # what llguidance refuses even leniently: a pattern with look-around
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(?=a)b"}},
            }
        },
        "response_format",
    ),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs"),
    ({"structured_outputs": {"grammar": "start: nowhere"}}, "structured_outputs"),
    ({"structured_outputs": "json"}, "structured_outputs"),
    (
        {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
        "structured_outputs",
    ),
]


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_bad_constraints_are_400_naming_the_field(server, route):
    base = {"model": "tiny", "max_tokens": 4}
    base.update({"prompt": "x"} if route == "/v1/completions" else {"messages": MESSAGES})
    with httpx.Client(base_url=server.url, timeout=120) as http:
        for extra, param in BAD_OPENAI:
            response = http.post(route, json={**base, **extra})
            assert response.status_code == 400, (extra, response.text)
            error = response.json()["error"]
            assert error["param"] == param, (extra, error)
            assert error["type"] == "invalid_request_error" and error["message"]
        for grammar in ({"type": "regex", "value": "(x"}, {"type": "xml", "value": "a"}):
            response = http.post(
                "/generate", json={"inputs": "x", "parameters": {"grammar": grammar}}
            )
            assert response.status_code == 422 or response.status_code == 400, response.text
            assert "grammar" in response.json()["error"]
        ok = http.post(route, json=base)
        assert ok.status_code == 200, ok.text
        assert http.get("/health").status_code == 200


# -- hostile constraints: refused before they are compiled, or before output begins ---------------
HOSTILE = {  # constraint -> words the 400's message holds (the limit's flag, or the reason)
    "gbnf chain": ({"grammar": grammar_chain(4500)}, "--max-grammar-rules"),
    "lark chain": ({"grammar": grammar_chain(4500, lark=True)}, "--max-grammar-rules"),
    "deep chain": ({"grammar": grammar_chain(200)}, "--max-constraint-depth"),
    "50,001 enum values": ({"json": {"enum": [0] * 50_001}}, "--max-enum-values"),
    "14,000 properties": (
        {"json": {"type": "object", "properties": {f"prop_{i:05}": {} for i in range(14000)}}},
        "--max-schema-properties",
    ),
    "1 MB schema": (
        {"json": {"type": "object", "description": "x" * (1 << 20)}},
        "--max-constraint-bytes",
    ),
    "deep schema": (
        {"json": json.loads('{"type": "array", "items": ' * 40 + "{}" + "}" * 40)},
        "--max-constraint-depth",
    ),
    "rows over 2,000 items": ({"json": optional_properties(600)}, "Current row has"),
    "nested repetition": ({"regex": "(a{1000}){1000}"}, "too many expressions"),
    "refers to itself": ({"json": {"$ref": "#"}}, "admits no output"),
    "mutual references": (
        {
            "json": {
                "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                "$ref": "#/$defs/a",
            }
        },
        "admits no output",
    ),
    "allOf itself": ({"json": {"allOf": [{"$ref": "#"}]}}, "admits no output"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_constraints_are_400_naming_the_limit(server, name):
    constraint, words = HOSTILE[name]
    with httpx.Client(base_url=server.url, timeout=120) as http:
        response = http.post(
            "/v1/completions",
            json={"prompt": "x", "max_tokens": 4, "structured_outputs": constraint},
        )
        assert response.status_code == 400, response.text[:500]
        error = response.json()["error"]
        assert error["param"] == "structured_outputs" and words in error["message"], error
        assert http.get("/health").status_code == 200


def test_grammar_failing_after_output_began_ends_as_an_error(server):
    """A grammar llguidance cannot follow past its first 32 tokens (the dry run): its request
    fails where the parser gives up. Never a 200 with an invented finish reason: 500 (not
    streamed), or a last chunk with finish_reason "error", an error event and no [DONE]."""
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 40, "maxLength": 40},
            "tags": optional_properties(600),
        },
        "required": ["name", "tags"],
        "additionalProperties": False,
    }
    body = {"prompt": "x", "max_tokens": 120, "temperature": 0.0}
    body["structured_outputs"] = {"json": schema}
    with httpx.Client(base_url=server.url, timeout=300) as http:
        answer = http.post("/v1/completions", json=body)
        assert answer.status_code == 500, answer.text[:300]
        error = answer.json()["error"]
        assert error["type"] == "server_error" and "Current row has" in error["message"]
        with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as stream:
            events = [line[5:].strip() for line in stream.iter_lines() if line.startswith("data:")]
        assert "[DONE]" not in events
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "error"
        assert json.loads(events[-1])["error"]["code"] == 500
        tgi = {
            "inputs": "x",
            "parameters": {"max_new_tokens": 120, "grammar": {"type": "json", "value": schema}},
        }
        with http.stream("POST", "/generate_stream", json=tgi) as stream:
            events = [line[5:].strip() for line in stream.iter_lines() if line.startswith("data:")]
        assert json.loads(events[-1])["error_type"] == "generation"
        assert http.get("/health").status_code == 200
