"""Tool calling on ``/v1/chat/completions`` against the real server on the tiny model: named,
required and auto calls following their schemas, conversations with tool results, and bad tool
input answered with OpenAI's 400 naming the field (the parsers alone:
``test_server_tool_parsers.py``)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from jaxgen.tool_calling import ToolRequest, check_conversation, check_tools, render_chat
from serving.app import create_app
from serving.settings.resolve import ServerSettings
from serving.testing import TINY_ENGINE_KNOBS, ServerThread, shared_llm
from tests.serving.tool_examples import TOOLS, pairs

SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


# -- the server on the tiny model ------------------------------------------------------------------
# The default tests share the other server tests' engine (256-token context), so they offer one
# compact tool (prompts of ~190 tokens); the slow ones take two tools on a 512-token engine.
COMPACT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 8}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]
COMPACT_SCHEMAS = {"get_weather": COMPACT_TOOLS[0]["function"]["parameters"]}


def start_server(llm, tiny_model_dir):
    settings = ServerSettings(model=tiny_model_dir, served_model_name="tiny")
    running = ServerThread(create_app(llm, settings))
    running.llm = llm
    return running


@pytest.fixture(scope="module")
def long_oai(tiny_model_dir):
    llm = shared_llm(tiny_model_dir, **{**TINY_ENGINE_KNOBS, "max_model_len": 512})
    with start_server(llm, tiny_model_dir) as running:
        client = openai.OpenAI(
            base_url=f"{running.url}/v1", api_key="unused", max_retries=0, timeout=120
        )
        client.llm = llm
        yield client


def prompt_tokens(llm, messages, tools) -> int:
    text = render_chat(llm.tokenizer, check_conversation(messages), tools=check_tools(tools))
    return len(llm.tokenizer.encode(text, add_special_tokens=False))


def final_choice(oai, stream: bool, **kwargs):
    """The first choice, non-streamed or accumulated from the stream by the SDK."""
    if not stream:
        return oai.chat.completions.create(**kwargs).choices[0]
    state = ChatCompletionStreamState()
    for chunk in oai.chat.completions.create(stream=True, **kwargs):
        state.handle_chunk(chunk)
    try:
        return state.get_final_completion().choices[0]
    except openai.LengthFinishReasonError as error:  # the SDK's refusal of a cut answer
        return error.completion.choices[0]


def check_calls(choice, schemas, name=None, *, truncated_ok: bool = False) -> None:
    """``tool_calls`` with ids whose arguments validate against their tool's schema.
    ``truncated_ok``: a list of parallel calls may run into ``max_tokens``; the calls before the
    cut still count."""
    reasons = ("tool_calls", "length") if truncated_ok else ("tool_calls",)
    assert choice.finish_reason in reasons, choice
    calls = choice.message.tool_calls
    assert calls and all(c.id.startswith("call_") and c.type == "function" for c in calls)
    if name is not None:
        assert [c.function.name for c in calls] == [name]
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


@pytest.mark.parametrize("stream", [False, True])
def test_named_and_required_calls_follow_the_schema(oai, stream):
    kwargs = dict(model="tiny", messages=USER, tools=COMPACT_TOOLS, max_tokens=40, seed=1)
    named = final_choice(oai, stream, tool_choice=NAMED, **kwargs)
    check_calls(named, COMPACT_SCHEMAS, name="get_weather")
    required = final_choice(
        oai, stream, tool_choice="required", parallel_tool_calls=False, **kwargs
    )
    check_calls(required, COMPACT_SCHEMAS)
    several = final_choice(oai, stream, tool_choice="required", **kwargs)
    check_calls(several, COMPACT_SCHEMAS, truncated_ok=True)


def test_named_tool_streams_name_then_arguments(oai):
    """A named choice: one call whose arguments stream as generated; stream == non-stream."""
    kwargs = dict(
        model="tiny",
        messages=USER,
        tools=COMPACT_TOOLS,
        tool_choice=NAMED,
        max_tokens=40,
        temperature=0,
    )
    whole = oai.chat.completions.create(**kwargs).choices[0]
    check_calls(whole, COMPACT_SCHEMAS, name="get_weather")
    chunks = list(oai.chat.completions.create(stream=True, **kwargs))
    deltas = [d for c in chunks for ch in c.choices for d in ch.delta.tool_calls or []]
    assert deltas[0].function.name == "get_weather" and deltas[0].id.startswith("call_")
    assert len(deltas) > 2 and all(d.function.name is None and d.id is None for d in deltas[1:])
    assert "".join(d.function.arguments or "" for d in deltas) == (
        whole.message.tool_calls[0].function.arguments
    )
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_conversation_with_tool_calls_and_results(server, oai):
    messages = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_abc", "content": "22 C"},
    ]
    result = oai.chat.completions.create(
        model="tiny", messages=messages, tools=COMPACT_TOOLS, max_tokens=4, temperature=0
    )
    assert result.usage.prompt_tokens == prompt_tokens(server.llm, messages, COMPACT_TOOLS)
    assert result.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.slow
def test_auto_offers_tools_and_parses_the_output(long_oai):
    kwargs = dict(model="tiny", messages=USER, tools=TOOLS, max_tokens=6, temperature=0)
    result = long_oai.chat.completions.create(**kwargs)
    assert result.usage.prompt_tokens == prompt_tokens(long_oai.llm, USER, TOOLS)
    plain = long_oai.chat.completions.create(tool_choice="none", **kwargs)
    # the same prompt; "auto" reads the same text for calls (the tiny model writes none)
    assert plain.usage.prompt_tokens == result.usage.prompt_tokens
    content, calls = ToolRequest.build(TOOLS).parse(plain.choices[0].message.content)
    assert result.choices[0].message.content == content
    assert pairs(result.choices[0].message.tool_calls) == [
        (c.name, json.loads(c.arguments)) for c in calls
    ]


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_calls_follow_the_schemas_of_several_tools(long_oai, stream):
    """Sampled at temperature 1: every call validates against its own tool's schema."""
    for seed in range(10):
        kwargs = dict(
            model="tiny", messages=USER, tools=TOOLS, max_tokens=80, temperature=1.0, seed=seed
        )
        check_calls(
            final_choice(long_oai, stream, tool_choice=NAMED, **kwargs), SCHEMAS, name="get_weather"
        )
        single = final_choice(
            long_oai, stream, tool_choice="required", parallel_tool_calls=False, **kwargs
        )
        check_calls(single, SCHEMAS)
        assert len(single.message.tool_calls) == 1
        several = final_choice(long_oai, stream, tool_choice="required", **kwargs)
        check_calls(several, SCHEMAS, truncated_ok=True)


@pytest.mark.parametrize(
    "extra,param",
    [
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": NAMED}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
        (
            {"tools": [{"type": "function", "function": {"description": "x"}}]},
            "tools[0].function.name",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": "object"}}]},
            "tools[0].function.parameters",
        ),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}
                ]
            },
            "tools[0].function.parameters.type",
        ),
        ({"tools": {"get_weather": {}}}, "tools"),
        ({"tools": TOOLS, "parallel_tool_calls": "no"}, "parallel_tool_calls"),
        ({"messages": [{"role": "tool", "content": "22 C"}]}, "messages[0].tool_call_id"),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"type": "function"}]}]},
            "messages[0].tool_calls[0].function",
        ),
    ],
)
def test_bad_tool_input_is_a_400_naming_the_field(server, extra, param):
    body = {"model": "tiny", "messages": USER, "max_tokens": 2, **extra}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert f"`{param}`" in error["message"]


@pytest.mark.parametrize(
    "choice,param",
    [
        ({"type": "function", "function": {"name": "g"}}, "tools[1].function.parameters"),
        ("required", "tools"),
    ],
)
def test_schema_the_grammar_refuses_is_a_400_naming_the_tool(server, choice, param):
    bad = {"type": "object", "properties": {"a": {"type": "strin"}}}
    tools = [COMPACT_TOOLS[0], {"type": "function", "function": {"name": "g", "parameters": bad}}]
    body = {
        "model": "tiny",
        "messages": USER,
        "max_tokens": 2,
        "tools": tools,
        "tool_choice": choice,
    }
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_tool_choice_with_response_format_is_refused(server):
    body = {
        "model": "tiny",
        "messages": USER,
        "max_tokens": 2,
        "tools": COMPACT_TOOLS,
        "tool_choice": NAMED,
        "response_format": {"type": "json_object"},
    }
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "tool_choice"


def test_bad_tool_input_through_the_sdk_then_still_serving(oai):
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(
            model="tiny",
            messages=USER,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "missing"}},
        )
    assert caught.value.body["param"] == "tool_choice.function.name"
    ok = oai.chat.completions.create(
        model="tiny", messages=USER, tools=COMPACT_TOOLS, max_tokens=4, temperature=0
    )
    assert ok.choices[0].message.role == "assistant"
