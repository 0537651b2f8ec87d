"""Tool schemas beyond flat objects: arguments with local references (``$defs``,
``definitions``, recursion, pointers into their own properties) under ``tool_choice``
"required", and a named call cut short, which is text, never a call that does not parse."""

from __future__ import annotations

import json

import jsonschema
import pytest

from jaxgen.sampling_params import SamplingParams
from jaxgen.tool_calling import ToolRequest, check_tools, tool_choice_schema
from tests.tool_calling.test_tool_calling import CONVERSATION, NAMED, TOOLS

# Tools whose arguments use local references: "$defs" (vLLM's server tests), "definitions" with
# recursion, and a pointer into the schema's own properties.
REF_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "$defs": {
                    "WeatherOptions": {
                        "type": "object",
                        "properties": {"unit": {"type": "string", "enum": ["c", "f"]}},
                        "required": ["unit"],
                    }
                },
                "properties": {
                    "city": {"type": "string", "maxLength": 12},
                    "options": {"$ref": "#/$defs/WeatherOptions"},
                    "again": {"$ref": "#/properties/city"},
                },
                "required": ["city", "options"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "make_tree",
            "parameters": {
                "type": "object",
                "definitions": {
                    "node": {
                        "type": "object",
                        "properties": {
                            "label": {"type": "string", "maxLength": 4},
                            "children": {
                                "type": "array",
                                "items": {"$ref": "#/definitions/node"},
                                "maxItems": 1,
                            },
                        },
                        "required": ["label"],
                    }
                },
                "$ref": "#/definitions/node",
            },
        },
    },
]


def test_required_schema_keeps_each_tools_references():
    tools = check_tools(REF_TOOLS)
    schema = tool_choice_schema(tools, ToolRequest.build(REF_TOOLS, "required").choice)
    jsonschema.Draft202012Validator.check_schema(schema)
    good = [
        {"name": "get_weather", "parameters": {"city": "Oslo", "options": {"unit": "c"}}},
        {"name": "make_tree", "parameters": {"label": "a", "children": [{"label": "b"}]}},
    ]
    jsonschema.validate(good, schema)
    for bad in (
        [{"name": "get_weather", "parameters": {"city": "Oslo", "options": {"unit": "k"}}}],
        [{"name": "get_weather", "parameters": {"city": "Oslo", "options": {}, "again": 3}}],
        [{"name": "make_tree", "parameters": {"label": "a", "children": [{"label": 1}]}}],
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    plain = tool_choice_schema(check_tools(TOOLS), ToolRequest.build(TOOLS, "required").choice)
    assert "$defs" not in plain  # tools without references are embedded as they are


def test_llm_chat_required_with_referencing_tools(smollm2_llm):
    # the grammar builds with both tools; the recursive one is left out of the generation (a
    # real model may nest it as deep as max_tokens allows)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in REF_TOOLS}
    params = SamplingParams(max_tokens=96, temperature=0)
    out = smollm2_llm.chat(
        CONVERSATION[:1], params, tools=REF_TOOLS[:1], tool_choice="required", use_tqdm=False
    )[0]
    assert out.finish_reason == "stop" and out.tool_calls, out.text
    for call in out.tool_calls:
        jsonschema.validate(json.loads(call.arguments), schemas[call.name])


def test_named_call_cut_short_is_text_not_a_broken_call():
    request = ToolRequest.build(TOOLS, NAMED)
    content, calls = request.parse('{"city": "Par')  # max_tokens ended the arguments
    assert calls == [] and content == '{"city": "Par'
    content, calls = request.parse('{"city": "Paris"}')
    assert content is None and [c.arguments for c in calls] == ['{"city": "Paris"}']
