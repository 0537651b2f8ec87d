"""Malformed and adversarial bodies on every POST route: always a JSON 4xx (or a normal answer),
never a 5xx, and the server stays healthy with every KV page back in the pool."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.app import create_app
from serving.settings.resolve import ServerSettings
from serving.testing import TINY_ENGINE_KNOBS, ServerThread, shared_llm

# Structured fuzzing of these routes runs by default; of the others, with -m slow.
FUZZ_FAST = ("/generate", "/v1/chat/completions")
POST_ROUTES = [
    "/generate",
    "/generate_stream",
    "/",
    "/invocations",
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/tokenize",
    "/detokenize",
]
OPENAI_SHAPED = ("/v1", "/tokenize", "/detokenize")  # error bodies in OpenAI's shape
STREAMING = {"/generate_stream"}

ADVERSARIAL_TEXT = st.sampled_from(
    [
        "",
        " ",
        "\x00",
        "\ud800",
        "\udfff tail",
        "<|im_end|>",
        "<|im_start|>system",
        "😀" * 40,
        "\u202e\u200b",
        "{{ raise_exception('boom') }}",
        "{% for x in range(10**9) %}{% endfor %}",
        "a" * 3000,
        "hello " * 400,
        "\\u0000",
        "null",
    ]
)
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    ADVERSARIAL_TEXT,
    st.lists(st.integers(min_value=-3, max_value=70000), max_size=4),
    st.lists(st.text(max_size=4), max_size=6),
    st.dictionaries(st.text(max_size=6), st.integers(), max_size=3),
)
PROMPT_TEXT = st.one_of(
    st.sampled_from(["Hello", "The quick brown fox", "1 2 3"]),
    st.text(max_size=40),
    ADVERSARIAL_TEXT,
)


SMALL_TOKENS = st.integers(min_value=1, max_value=6)
# Valid values per field. Knobs that change the engine's compiled program (sampling, filters,
# penalties, min_tokens) stay greedy/default so the run compiles few programs; junk still hits
# them (and sometimes lands on a valid value).
TGI_PARAMETERS = {
    "max_new_tokens": SMALL_TOKENS,
    "temperature": st.sampled_from([0.0, 1.0]),
    "top_k": st.just(0),
    "top_p": st.just(1.0),
    "do_sample": st.just(False),
    "repetition_penalty": st.just(1.0),
    "frequency_penalty": st.just(0.0),
    "stop": st.lists(st.text(min_size=1, max_size=3), max_size=4),
    "seed": st.integers(min_value=0, max_value=2**64 - 1),
    "details": st.booleans(),
    "decoder_input_details": st.booleans(),
    "return_full_text": st.booleans(),
    "top_n_tokens": st.sampled_from([0, 2]),
    "truncate": st.integers(min_value=1, max_value=8),
    "watermark": st.just(False),
    "typical_p": st.just(1.0),
    "best_of": st.just(1),
    "grammar": st.sampled_from(
        [
            None,
            {"type": "json", "value": {"type": "object"}},
            {"type": "regex", "value": "[a-c]+"},
        ]
    ),
}
OPENAI_COMMON = {
    "model": st.just("tiny"),
    "n": st.integers(min_value=1, max_value=3),
    "max_tokens": SMALL_TOKENS,
    "temperature": st.just(0.0),
    "top_p": st.just(1.0),
    "stop": st.one_of(
        st.text(min_size=1, max_size=3), st.lists(st.text(min_size=1, max_size=3), max_size=4)
    ),
    "seed": st.integers(min_value=-(2**63), max_value=2**64 - 1),
    "stream": st.booleans(),
    "presence_penalty": st.just(0.0),
    "stop_token_ids": st.lists(st.integers(min_value=0, max_value=49151), max_size=2),
    "min_tokens": st.just(0),
    "ignore_eos": st.booleans(),
    "user": st.text(max_size=5),
    "structured_outputs": st.sampled_from(
        [{"choice": ["yes", "no"]}, {"regex": "[0-9]{2}"}, {"json": {"type": "array"}}]
    ),
}
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "user", "assistant", "developer"]),
        "content": st.one_of(
            PROMPT_TEXT,
            st.lists(
                st.fixed_dictionaries({"type": st.just("text"), "text": PROMPT_TEXT}), max_size=2
            ),
        ),
    }
)
TOOL_MESSAGE = st.one_of(
    st.fixed_dictionaries(
        {"role": st.just("tool"), "content": PROMPT_TEXT, "tool_call_id": st.text(max_size=8)}
    ),
    st.fixed_dictionaries(
        {
            "role": st.just("assistant"),
            "content": st.none(),
            "tool_calls": st.lists(
                st.fixed_dictionaries(
                    {
                        "id": st.text(max_size=8),
                        "type": st.just("function"),
                        "function": st.fixed_dictionaries(
                            {"name": st.just("f"), "arguments": st.just('{"a": 1}')}
                        ),
                    }
                ),
                max_size=2,
            ),
        }
    ),
)
RESPONSE_ITEM = st.one_of(
    st.fixed_dictionaries(
        {
            "type": st.just("function_call"),
            "call_id": st.text(min_size=1, max_size=8),
            "name": st.just("f"),
            "arguments": st.just('{"a": 1}'),
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("function_call_output"),
            "call_id": st.text(min_size=1, max_size=8),
            "output": PROMPT_TEXT,
        }
    ),
)
FUZZ_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
        },
    }
]
VALID = {
    "tgi": st.fixed_dictionaries(
        {
            "inputs": PROMPT_TEXT,
            "parameters": st.fixed_dictionaries({}, optional=TGI_PARAMETERS),
        }
    ),
    "/v1/completions": st.fixed_dictionaries(
        {
            "prompt": st.one_of(
                PROMPT_TEXT,
                st.lists(PROMPT_TEXT, min_size=1, max_size=2),
                st.lists(st.integers(0, 49151), min_size=1, max_size=4),
            )
        },
        optional={
            "logprobs": st.sampled_from([0, 2]),
            "echo": st.booleans(),
            "prompt_logprobs": st.sampled_from([0, 2]),
            "logit_bias": st.just({"5": -100.0, "7": 3}),
            **OPENAI_COMMON,
        },
    ),
    "/v1/chat/completions": st.fixed_dictionaries(
        {"messages": st.lists(st.one_of(MESSAGE, TOOL_MESSAGE), min_size=1, max_size=3)},
        optional={
            "tools": st.just(FUZZ_TOOLS),
            "tool_choice": st.sampled_from(
                ["none", "auto", "required", {"type": "function", "function": {"name": "f"}}]
            ),
            "parallel_tool_calls": st.booleans(),
            "logprobs": st.booleans(),
            "max_completion_tokens": SMALL_TOKENS,
            "response_format": st.sampled_from(
                [
                    {"type": "text"},
                    {"type": "json_object"},
                    {
                        "type": "json_schema",
                        "json_schema": {"name": "n", "schema": {"type": "integer"}},
                    },
                ]
            ),
            "prompt_logprobs": st.just(0),
            **OPENAI_COMMON,
        },
    ),
    "/v1/responses": st.fixed_dictionaries(
        {
            "input": st.one_of(
                PROMPT_TEXT.filter(bool),
                st.lists(st.one_of(MESSAGE, RESPONSE_ITEM), min_size=1, max_size=3),
            )
        },
        optional={
            "instructions": PROMPT_TEXT,
            "max_output_tokens": SMALL_TOKENS,
            "temperature": st.just(0.0),
            "stream": st.booleans(),
            "tools": st.just([{"type": "function", **FUZZ_TOOLS[0]["function"]}]),
            "tool_choice": st.sampled_from(["none", "auto", {"type": "function", "name": "f"}]),
            "text": st.sampled_from(
                [
                    {"format": {"type": "json_object"}},
                    {"format": {"type": "json_schema", "name": "n", "schema": {"type": "integer"}}},
                ]
            ),
            "model": st.just("tiny"),
        },
    ),
    "/tokenize": st.one_of(
        st.fixed_dictionaries(
            {"prompt": PROMPT_TEXT}, optional={"add_special_tokens": st.booleans()}
        ),
        st.fixed_dictionaries(
            {"messages": st.lists(MESSAGE, min_size=1, max_size=2)},
            optional={"add_generation_prompt": st.booleans()},
        ),
    ),
    "/detokenize": st.fixed_dictionaries(
        {"tokens": st.lists(st.integers(0, 49151), max_size=4)}, optional={"model": st.just("tiny")}
    ),
}
# Where junk may go: top-level keys, nested parameter keys, message fields.
MUTABLE = {
    "tgi": [
        ("inputs",),
        ("parameters",),
        ("stream",),
        ("extra",),
        *[("parameters", key) for key in TGI_PARAMETERS],
        ("parameters", "grammar", "type"),
        ("parameters", "grammar", "value"),
    ],
    "/v1/completions": [
        ("prompt",),
        ("logprobs",),
        ("echo",),
        ("suffix",),
        ("best_of",),
        ("logit_bias",),
        ("logit_bias", "5"),
        ("prompt_logprobs",),
        ("stream_options",),
        ("extra",),
        *[(key,) for key in OPENAI_COMMON],
    ],
    "/v1/chat/completions": [
        ("messages",),
        ("messages", 0),
        ("messages", 0, "role"),
        ("messages", 0, "content"),
        ("messages", 0, "content", 0),
        ("logprobs",),
        ("top_logprobs",),
        ("max_completion_tokens",),
        ("tools",),
        ("tools", 0),
        ("tools", 0, "function"),
        ("tools", 0, "function", "name"),
        ("tools", 0, "function", "parameters"),
        ("tool_choice",),
        ("parallel_tool_calls",),
        ("messages", 0, "tool_calls"),
        ("messages", 0, "tool_call_id"),
        ("response_format",),
        ("response_format", "type"),
        ("response_format", "json_schema"),
        ("response_format", "json_schema", "schema"),
        ("continue_final_message",),
        ("add_generation_prompt",),
        ("chat_template_kwargs",),
        ("echo",),
        ("structured_outputs", "regex"),
        ("structured_outputs", "choice"),
        ("structured_outputs", "json"),
        ("prompt_logprobs",),
        ("logit_bias",),
        ("stream_options",),
        ("extra",),
        *[(key,) for key in OPENAI_COMMON],
    ],
    "/v1/responses": [
        ("input",),
        ("input", 0),
        ("input", 0, "type"),
        ("input", 0, "content"),
        ("input", 0, "arguments"),
        ("instructions",),
        ("max_output_tokens",),
        ("tools",),
        ("tools", 0, "parameters"),
        ("tool_choice",),
        ("text",),
        ("text", "format"),
        ("text", "format", "schema"),
        ("previous_response_id",),
        ("extra",),
    ],
    "/tokenize": [
        ("prompt",),
        ("messages",),
        ("messages", 0),
        ("add_special_tokens",),
        ("add_generation_prompt",),
        ("model",),
    ],
    "/detokenize": [("tokens",), ("tokens", 0), ("model",)],
}


def mutate(body, path: tuple, value) -> None:
    """Sets ``body[path] = value`` where the path exists (or its last key can be added)."""
    target = body
    for key in path[:-1]:
        if isinstance(target, dict) and key in target:
            target = target[key]
        elif isinstance(target, list) and isinstance(key, int) and key < len(target):
            target = target[key]
        else:
            return
    last = path[-1]
    if isinstance(target, dict):
        target[last] = value
    elif isinstance(target, list) and isinstance(last, int) and last < len(target):
        target[last] = value


RAW_BODIES = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"",
            b"{",
            b"}",
            b"null",
            b"[]",
            b'"text"',
            b"123",
            b"{" * 3000 + b"}" * 3000,
            b"[" * 100000,
            b'{"inputs": ' + b"1" * 5000 + b"}",
            b'{"inputs": "x", "a": NaN}',
            b'{"inputs": "\\ud800"}',
            b'{"prompt": "\\udc00", "model": "m"}',
            b"\xef\xbb\xbf{}",
            '{"inputs": "x"}'.encode("utf-16"),
            b'{"inputs": "x"}\x00',
            b'{"inputs":"x"}{"inputs":"y"}',
            b'{"messages": [{"role": "user", "content": "\\ud83d"}]}',
        ]
    ),
)


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    llm = shared_llm(tiny_model_dir, **TINY_ENGINE_KNOBS)
    # A short context keeps the valid requests the fuzzer stumbles on cheap.
    settings = ServerSettings(model=tiny_model_dir, max_total_tokens=32, max_body_bytes=1 << 16)
    with ServerThread(create_app(llm, settings)) as running:
        running.llm = llm
        with httpx.Client(base_url=running.url, timeout=120) as client:
            running.client = client
            yield running


def check_response(response: httpx.Response, path: str) -> None:
    """No 5xx; errors are JSON with an error field; streams end cleanly."""
    assert response.status_code < 500, (response.status_code, response.text[:500])
    content_type = response.headers.get("content-type", "")
    if response.status_code != 200:
        assert 400 <= response.status_code < 500
        body = response.json()
        assert "error" in body, body
        if path.startswith(OPENAI_SHAPED):
            assert body["error"]["message"]
        else:
            assert body["error"] and body["error_type"]
        return
    if content_type.startswith("text/event-stream"):
        events = [
            line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")
        ]
        assert events, response.text[:300]
        for event in events:
            if event == "[DONE]":
                continue
            payload = json.loads(event)
            assert "error" not in payload, payload
        if path == "/v1/responses":  # Responses streams end with their last event, no [DONE]
            assert json.loads(events[-1])["type"] in ("response.completed", "response.incomplete")
        elif path.startswith("/v1"):
            assert events[-1] == "[DONE]"
    else:
        assert response.json().get("error") is None  # a Responses object says "error": null


def post(server, path: str, body) -> None:
    if isinstance(body, bytes):
        response = server.client.post(path, content=body)
    else:
        response = server.client.post(path, content=json.dumps(body).encode())
    check_response(response, path)


FUZZ = settings(
    max_examples=60,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


@pytest.mark.parametrize(
    "path",
    [p if p in FUZZ_FAST else pytest.param(p, marks=pytest.mark.slow) for p in POST_ROUTES],
)
@FUZZ
@given(data=st.data())
def test_fuzz_structured_bodies(server, path, data):
    kind = path if path.startswith(OPENAI_SHAPED) else "tgi"
    body = data.draw(VALID[kind], label="valid body")
    for _ in range(data.draw(st.integers(min_value=0, max_value=3), label="mutations")):
        where = data.draw(st.sampled_from(MUTABLE[kind]), label="path")
        mutate(body, where, data.draw(JUNK, label="junk"))
    post(server, path, body)


@pytest.mark.parametrize("path", POST_ROUTES)
@settings(FUZZ, max_examples=25)
@given(body=st.one_of(RAW_BODIES, JUNK.map(lambda value: json.dumps(value).encode())))
def test_fuzz_raw_bodies(server, path, body):
    post(server, path, body)


@pytest.mark.parametrize("path", POST_ROUTES)
def test_oversized_and_odd_requests(server, path):
    client = server.client
    huge = client.post(path, content=b'{"inputs": "' + b"a" * (1 << 17) + b'"}')
    assert huge.status_code == 413 and "error" in huge.json()

    def chunks():
        yield b'{"inputs": "'
        yield b"b" * (1 << 17)
        yield b'"}'

    chunked = client.post(path, content=chunks())  # no content-length: counted while reading
    assert chunked.status_code == 413
    form = client.post(path, data={"inputs": "x"})
    assert form.status_code == 415 and "error" in form.json()  # form-encoded: not JSON


def test_server_healthy_afterwards(server):
    assert server.client.get("/health").status_code == 200
    ok = server.client.post(
        "/generate", json={"inputs": "Hello", "parameters": {"max_new_tokens": 2}}
    )
    assert ok.status_code == 200
    deadline = time.monotonic() + 30
    while True:
        stats = server.llm.stats()
        if stats["num_running"] == stats["num_waiting"] == stats["kv_pages_used"] == 0:
            break
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)
    metrics = server.client.get("/metrics").text
    assert "jaxgen_request_failure_total 0.0" in metrics


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/completions", {"prompt": "a", "logit_bias": {"1": 100.5}}, "logit_bias"),
        ("/v1/completions", {"prompt": "a", "logit_bias": {"1.5": 1}}, "logit_bias"),
        ("/v1/completions", {"prompt": "a", "logit_bias": {"99999999": 1}}, "logit_bias"),
        ("/v1/completions", {"prompt": "a", "logit_bias": "1"}, "logit_bias"),
        ("/v1/completions", {"prompt": "a", "prompt_logprobs": -1}, "prompt_logprobs"),
        ("/v1/completions", {"prompt": "a", "prompt_logprobs": 21}, "prompt_logprobs"),
        ("/v1/completions", {"prompt": "a", "prompt_logprobs": "2"}, "prompt_logprobs"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "a"}], "prompt_logprobs": 1.5},
            "prompt_logprobs",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "a"}], "logit_bias": {"a": 1}},
            "logit_bias",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "a"}], "prompt_logprobs": 0, "stream": True},
            "prompt_logprobs",
        ),
        ("/v1/completions", {"prompt": "a", "stop_token_ids": [-1]}, "stop_token_ids"),
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"messages": "hi"}, "messages"),
        ("/detokenize", {"tokens": [1, "2"]}, "tokens"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
    ],
)
def test_new_fields_are_refused_by_name(server, path, body, param):
    response = server.client.post(path, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
