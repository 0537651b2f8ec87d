"""Tool requests: checking ``tools``/``tool_choice``/tool messages, rendering through chat
templates (with and without tool support), the schema "required" and named choices force, and
``LLM.chat(..., tools=...)``."""

from __future__ import annotations

import json

import jsonschema
import pytest

from jaxgen.sampling_params import SamplingParams
from jaxgen.tool_calling import (
    ToolError,
    ToolRequest,
    check_conversation,
    check_tools,
    render_chat,
    resolve_parser,
    tool_choice_schema,
)
from jaxgen.tool_calling.rendering import template_supports_tools

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": WEATHER_PARAMETERS,
        },
    },
    {"type": "function", "function": {"name": "get_time"}},
]
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "22 C, sunny"},
]
# A ChatML template that reads ``tools`` and ``tool_calls`` (as Qwen's does, in short).
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTOOLS:{{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }}:"
    "{{ c.function.arguments.city }}</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# -- checks ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "tools,param",
    [
        ({"type": "function"}, "tools"),
        (["get_weather"], "tools[0]"),
        ([{"type": "retrieval", "function": {"name": "f"}}], "tools[0].type"),
        ([{"type": "function"}], "tools[0].function"),
        ([{"type": "function", "function": {"description": "no name"}}], "tools[0].function.name"),
        ([{"type": "function", "function": {"name": "has space"}}], "tools[0].function.name"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": []}}],
            "tools[0].function.parameters",
        ),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
            "tools[0].function.parameters.type",
        ),
        (
            [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "properties": {"a": "string"}},
                    },
                }
            ],
            "tools[0].function.parameters.properties",
        ),
        (
            [
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "object", "required": "a"}},
                }
            ],
            "tools[0].function.parameters.required",
        ),
        ([TOOLS[1], TOOLS[1]], "tools[1].function.name"),
    ],
)
def test_malformed_tools_name_the_field(tools, param):
    with pytest.raises(ToolError) as caught:
        ToolRequest.build(tools)
    assert caught.value.param == param and f"`{param}`" in str(caught.value)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    "tools,choice,param",
    [
        (TOOLS, {"type": "function", "function": {"name": "missing"}}, "tool_choice.function.name"),
        (TOOLS, "sometimes", "tool_choice"),
        (TOOLS, {"type": "function"}, "tool_choice.function.name"),
        (TOOLS, {"name": "get_time"}, "tool_choice"),
        (None, "required", "tool_choice"),
        (None, "auto", "tool_choice"),
        ([], {"type": "function", "function": {"name": "get_time"}}, "tool_choice"),
    ],
)
def test_bad_tool_choice_names_the_field(tools, choice, param):
    with pytest.raises(ToolError) as caught:
        ToolRequest.build(tools, choice)
    assert caught.value.param == param


def test_tool_choice_defaults_and_modes():
    assert ToolRequest.build(None).choice.mode == "none"
    assert ToolRequest.build(TOOLS).choice.mode == "auto"
    assert ToolRequest.build(None, "none").parses_output is False
    named = ToolRequest.build(TOOLS, {"type": "function", "function": {"name": "get_time"}})
    assert named.choice.mode == "named" and named.choice.name == "get_time"
    assert ToolRequest.build(TOOLS, "required", parallel_tool_calls=False).choice.parallel is False
    with pytest.raises(ToolError, match="parallel_tool_calls"):
        ToolRequest.build(TOOLS, parallel_tool_calls="yes")
    # a tool without parameters takes none
    assert check_tools(TOOLS)[1]["function"]["parameters"] == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }


@pytest.mark.parametrize(
    "message,param",
    [
        ({"role": "tool", "content": "22 C"}, "messages[0].tool_call_id"),
        ({"role": "tool", "content": "22 C", "tool_call_id": 5}, "messages[0].tool_call_id"),
        ({"role": "assistant", "tool_calls": {"id": "x"}}, "messages[0].tool_calls"),
        ({"role": "assistant", "tool_calls": [{"id": "x"}]}, "messages[0].tool_calls[0].function"),
        (
            {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]},
            "messages[0].tool_calls[0].function.name",
        ),
        (
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]},
            "messages[0].tool_calls[0].function.arguments",
        ),
    ],
)
def test_bad_tool_messages_name_the_field(message, param):
    with pytest.raises(ToolError) as caught:
        check_conversation([message])
    assert caught.value.param == param


def test_unknown_parser_is_refused():
    with pytest.raises(ValueError, match="tool_call_parser"):
        resolve_parser("xml", None)
    assert resolve_parser("pythonic", None) == "pythonic"
    assert resolve_parser("auto", TOOLS_TEMPLATE) == "hermes"


# -- rendering -------------------------------------------------------------------------------------
def test_template_without_tools_gets_hermes_form(smollm2_tokenizer):
    assert not template_supports_tools(smollm2_tokenizer.chat_template)
    text = render_chat(
        smollm2_tokenizer, check_conversation(CONVERSATION), tools=check_tools(TOOLS)
    )
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\n# Tools")
    for tool in check_tools(TOOLS):  # each tool, as JSON, inside <tools></tools>
        assert json.dumps(tool) in system
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in (
        text
    )
    assert "<|im_start|>user\n<tool_response>\n22 C, sunny\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    # a system message of the conversation's own comes first, the tools after it
    own = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = render_chat(smollm2_tokenizer, own, tools=check_tools(TOOLS))
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    # without tools or tool messages, the template's own rendering
    plain = [{"role": "user", "content": "hi"}]
    assert render_chat(smollm2_tokenizer, plain) == smollm2_tokenizer.apply_chat_template(
        plain, tokenize=False, add_generation_prompt=True
    )


def test_template_with_tools_gets_them(smollm2_tokenizer):
    assert template_supports_tools(TOOLS_TEMPLATE)
    text = render_chat(
        smollm2_tokenizer,
        check_conversation(CONVERSATION),
        tools=check_tools(TOOLS),
        chat_template=TOOLS_TEMPLATE,
    )
    assert text.startswith("<|im_start|>system\nTOOLS:[{")
    assert '"name": "get_weather"' in text
    # the template read the call's arguments as an object
    assert "<tool_call>get_weather:Paris</tool_call>" in text
    assert "<|im_start|>tool\n22 C, sunny<|im_end|>" in text


# -- grammar schema --------------------------------------------------------------------------------
def test_required_schema_accepts_calls_and_refuses_others():
    tools = check_tools(TOOLS)
    request = ToolRequest.build(TOOLS, "required")
    schema = tool_choice_schema(tools, request.choice)
    jsonschema.Draft202012Validator.check_schema(schema)
    good = [
        {"name": "get_weather", "parameters": {"city": "Paris"}},
        {"name": "get_time", "parameters": {}},
    ]
    jsonschema.validate(good, schema)
    for bad in (
        [],
        [{"name": "get_weather", "parameters": {}}],  # city is required
        [{"name": "nope", "parameters": {}}],
        [{"name": "get_time", "parameters": {}, "extra": 1}],
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    single = tool_choice_schema(
        tools, ToolRequest.build(TOOLS, "required", parallel_tool_calls=False).choice
    )
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(good, single)
    assert request.constraint.json == schema


def test_named_schema_is_the_arguments():
    request = ToolRequest.build(TOOLS, {"type": "function", "function": {"name": "get_weather"}})
    assert request.constraint.json == WEATHER_PARAMETERS
    assert ToolRequest.build(TOOLS, "auto").constraint is None


# -- LLM.chat --------------------------------------------------------------------------------------
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def test_llm_chat_named_call_follows_the_schema(smollm2_llm):
    params = SamplingParams(max_tokens=32, temperature=0)
    out = smollm2_llm.chat(
        CONVERSATION[:1], params, tools=TOOLS, tool_choice=NAMED, use_tqdm=False
    )[0]
    assert "<tools>" in out.prompt and '"name": "get_weather"' in out.prompt
    [call] = out.tool_calls
    assert call.name == "get_weather" and call.id.startswith("call_")
    assert call.arguments == out.text and out.finish_reason == "stop"  # the whole output
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMETERS)
    with pytest.raises(ValueError, match="tool_choice.function.name"):
        smollm2_llm.chat(
            CONVERSATION[:1],
            params,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "missing"}},
        )
    with pytest.raises(ValueError, match="structured_outputs"):
        constrained = SamplingParams(structured_outputs={"json_object": True})
        smollm2_llm.chat(CONVERSATION[:1], constrained, tools=TOOLS, tool_choice=NAMED)


@pytest.mark.slow
def test_llm_chat_auto_and_none(smollm2_llm):
    params = SamplingParams(max_tokens=8, temperature=0)
    out = smollm2_llm.chat(CONVERSATION[:1], params, tools=TOOLS, use_tqdm=False)[0]
    expected = ToolRequest.build(TOOLS).parse(out.text)[1]
    assert out.tool_calls is not None
    assert [(c.name, c.arguments) for c in out.tool_calls] == [
        (c.name, c.arguments) for c in expected
    ]
    # "none" offers the tools but reads no calls
    out = smollm2_llm.chat(CONVERSATION, params, tools=TOOLS, tool_choice="none", use_tqdm=False)
    assert out[0].tool_calls is None and "<tool_response>" in out[0].prompt


@pytest.mark.slow
def test_llm_chat_required_follows_the_schemas(smollm2_llm):
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in check_tools(TOOLS)}
    for seed in range(5):
        params = SamplingParams(max_tokens=64, temperature=1.0, seed=seed)
        out = smollm2_llm.chat(
            CONVERSATION[:1],
            params,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            use_tqdm=False,
        )[0]
        assert out.finish_reason == "stop" and len(out.tool_calls) == 1, out.text
        assert out.tool_calls, out.text
        for call in out.tool_calls:
            jsonschema.validate(json.loads(call.arguments), schemas[call.name])
