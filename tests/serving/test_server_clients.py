"""What clients expect beyond completions and chat: the Responses API through the ``openai``
SDK, vLLM's chat-template controls (``continue_final_message``, ``chat_template_kwargs``,
``echo``), ``usage.prompt_tokens_details.cached_tokens``, and a named tool call kept to its
schema. One tiny-model server (the engine shared with the other server tests)."""

from __future__ import annotations

import json
import uuid

import jsonschema
import pytest

from serving.app import create_app
from serving.settings.resolve import ServerSettings
from serving.testing import TINY_ENGINE_KNOBS, ServerThread, shared_llm

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"type": "string", "enum": ["c", "f"]},
    },
    "required": ["city", "unit"],
}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
USER = [{"role": "user", "content": "What is the weather in Oslo?"}]


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    llm = shared_llm(tiny_model_dir, **TINY_ENGINE_KNOBS)
    settings = ServerSettings(model=tiny_model_dir, served_model_name="tiny")
    with ServerThread(create_app(llm, settings)) as running:
        running.llm = llm
        yield running


# -- Responses API --------------------------------------------------------------------------------
def test_responses_text_and_usage(oai):
    response = oai.responses.create(
        model="tiny", input="Say hi", instructions="Be brief.", max_output_tokens=6, temperature=0
    )
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status == "incomplete"  # a random model runs to max_output_tokens
    assert response.incomplete_details.reason == "max_output_tokens"
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"
    assert response.output_text == message.content[0].text and response.output_text
    assert response.usage.output_tokens == 6
    assert response.usage.input_tokens_details.cached_tokens >= 0
    details = response.usage.input_tokens_details
    assert details.cached_tokens + details.cache_write_tokens == response.usage.input_tokens
    type(response).model_validate(response.model_dump())  # every field the SDK requires
    assert response.instructions == "Be brief."
    chat = oai.chat.completions.create(
        model="tiny",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Say hi"},
        ],
        max_tokens=6,
        temperature=0,
    )
    assert chat.choices[0].message.content == response.output_text  # the same request
    assert chat.usage.prompt_tokens == response.usage.input_tokens


def test_responses_stream_events_add_up(oai):
    kwargs = dict(model="tiny", input=USER, max_output_tokens=5, temperature=0)
    whole = oai.responses.create(**kwargs)
    events = list(oai.responses.create(stream=True, **kwargs))
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == whole.output_text
    assert events[-1].response.output_text == text
    assert events[-1].response.usage.output_tokens == 5


def test_responses_json_schema_output(oai):
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON}
    response = oai.responses.create(
        model="tiny", input="A person.", text={"format": fmt}, max_output_tokens=60, temperature=1
    )
    assert response.status == "completed"
    value = json.loads(response.output_text)
    jsonschema.validate(value, {**PERSON, "additionalProperties": False})  # strict by default
    assert response.text.format.type == "json_schema"


def test_responses_function_call_streamed_and_not(oai):
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    choice = {"type": "function", "name": "get_weather"}
    kwargs = dict(model="tiny", input=USER, tools=tools, tool_choice=choice, max_output_tokens=50)
    response = oai.responses.create(temperature=0, **kwargs)
    [call] = response.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id.startswith("call_")
    arguments = json.loads(call.arguments)
    jsonschema.validate(arguments, {**WEATHER, "additionalProperties": False})
    events = list(oai.responses.create(stream=True, temperature=0, **kwargs))
    streamed = "".join(
        e.delta for e in events if e.type == "response.function_call_arguments.delta"
    )
    assert streamed == call.arguments
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done[0].arguments == call.arguments
    # The call and its output go back in as input items: the conversation chat would render.
    items = [
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        },
        {"type": "function_call_output", "call_id": call.call_id, "output": "12 C"},
    ]
    follow = oai.responses.create(
        model="tiny", input=[*USER, *items], max_output_tokens=4, temperature=0
    )
    messages = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "12 C"},
    ]
    chat = oai.chat.completions.create(model="tiny", messages=messages, max_tokens=4, temperature=0)
    assert follow.usage.input_tokens == chat.usage.prompt_tokens
    assert follow.output_text == chat.choices[0].message.content


@pytest.mark.parametrize(
    "body, param",
    [
        ({"input": []}, "input"),
        ({"input": [{"type": "image", "url": "x"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": "hi", "previous_response_id": 7}, "previous_response_id"),
        ({"input": "hi", "top_logprobs": 21}, "top_logprobs"),
        ({"input": "hi", "include": ["file_contents"]}, "include[0]"),
        ({"input": "hi", "store": False, "background": True}, "background"),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        (
            {
                "input": "hi",
                "tools": [{"type": "function", "name": "f", "parameters": {"type": 3}}],
            },
            "tools[0].parameters.type",
        ),
        (
            {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}},
            "text.format.schema",
        ),
        (
            {"input": "hi", "text": {"format": {"type": "json_schema", "schema": {"type": 5}}}},
            "text.format.schema",
        ),
    ],
)
def test_responses_bad_input_is_a_400_naming_the_field(http, body, param):
    answer = http.post("/v1/responses", json={"model": "tiny", **body})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


# -- chat-template controls ---------------------------------------------------------------------
PREFILL = [
    {"role": "user", "content": "Name a book."},
    {"role": "assistant", "content": "The best book is"},
]


def test_continue_final_message_continues_the_prefill(server, oai, http):
    tokenizer = server.llm.tokenizer
    out = oai.chat.completions.create(
        model="tiny",
        messages=PREFILL,
        max_tokens=6,
        temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False, "echo": True},
    )
    prompt = tokenizer.apply_chat_template(PREFILL, tokenize=False, continue_final_message=True)
    assert prompt.endswith("<|im_start|>assistant\nThe best book is")  # left open
    same = oai.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0)
    content = out.choices[0].message.content
    assert content == "The best book is" + same.choices[0].text  # echo, then the continuation
    assert out.usage.prompt_tokens == len(tokenizer.encode(prompt, add_special_tokens=False))
    for extra, message in (
        ({"continue_final_message": True, "add_generation_prompt": True}, PREFILL),
        ({"continue_final_message": True}, PREFILL[:1]),
        ({"chat_template_kwargs": {"tokenize": True}}, PREFILL[:1]),
        ({"chat_template_kwargs": [1]}, PREFILL[:1]),
    ):
        body = {"model": "tiny", "messages": message, "max_tokens": 2, **extra}
        answer = http.post("/v1/chat/completions", json=body)
        assert answer.status_code == 400, (extra, answer.text)
        assert answer.json()["error"]["param"] == next(iter(extra)), answer.json()
    # Streamed with echo: the prefill leads the first chunk.
    chunks = list(
        oai.chat.completions.create(
            model="tiny",
            messages=PREFILL,
            max_tokens=6,
            temperature=0,
            stream=True,
            extra_body={"continue_final_message": True, "echo": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == content


def test_chat_template_kwargs_reach_the_template(server, http):
    template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "{% if enable_thinking is defined and not enable_thinking %}/no_think{% endif %}"
    )
    tokenizer = server.llm.tokenizer
    original = tokenizer.chat_template
    tokenizer.chat_template = template
    try:
        off = {"chat_template_kwargs": {"enable_thinking": False}}
        body = {"model": "tiny", "messages": USER, "max_tokens": 1}
        plain = http.post("/v1/chat/completions", json=body).json()
        thinking_off = http.post("/v1/chat/completions", json={**body, **off}).json()
    finally:
        tokenizer.chat_template = original
    suffix = len(tokenizer.encode("/no_think", add_special_tokens=False))
    assert thinking_off["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"] + suffix


# -- cached tokens ------------------------------------------------------------------------------
def test_cached_tokens_count_prefix_cache_hits(oai):
    prompt = f"{uuid.uuid4().hex} " + "a long shared prefix for the cache " * 6
    first = oai.completions.create(model="tiny", prompt=prompt, max_tokens=1)
    assert first.usage.prompt_tokens_details.cached_tokens == 0  # fresh
    again = oai.completions.create(model="tiny", prompt=prompt, max_tokens=1)
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    assert again.usage.prompt_tokens_details.cached_tokens < again.usage.prompt_tokens
    messages = [{"role": "user", "content": prompt}]
    oai.chat.completions.create(model="tiny", messages=messages, max_tokens=1)
    chat = oai.chat.completions.create(model="tiny", messages=messages, max_tokens=1)
    assert chat.usage.prompt_tokens_details.cached_tokens > 0
    response = oai.responses.create(model="tiny", input=prompt, max_output_tokens=1)
    assert response.usage.input_tokens_details.cached_tokens > 0


# -- strict tool arguments ----------------------------------------------------------------------
def test_named_tool_call_keeps_to_its_schema(oai):
    """The failing call of issue 44 (no ``additionalProperties`` key), at ``max_tokens`` 50 (the
    tools' prompt takes 203 of the tiny engine's 256 tokens)."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    out = oai.chat.completions.create(
        model="tiny",
        messages=USER,
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=50,
        temperature=1,
        seed=3,
        n=4,
    )
    for choice in out.choices:
        assert choice.finish_reason == "tool_calls"
        arguments = json.loads(choice.message.tool_calls[0].function.arguments)
        assert set(arguments) == {"city", "unit"}
