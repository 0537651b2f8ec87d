"""Strict schemas by default: tool arguments and ``json_schema`` outputs admit no property or
array item the schema does not declare, unless it allows them or the request asks for the lenient
reading."""

from __future__ import annotations

import jsonschema
import pytest

from jaxgen.engine.structured.grammar_masks import grammar_compiler
from jaxgen.structured_outputs import StructuredOutputsParams
from jaxgen.structured_outputs.strict_schemas import strict_schema
from jaxgen.tool_calling import ToolRequest

# The tool of the failing call: no ``additionalProperties`` key.
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30, "description": "A city in the world"},
        "unit": {"type": "string", "enum": ["c", "f"]},
    },
    "required": ["city", "unit"],
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
INVENTED = '{"city":"Oslo","unit":"c","type":"string","maxLength":"30"}'


def test_strict_schema_closes_declared_objects_and_tuples():
    nested = {
        "type": "object",
        "properties": {
            "point": {"type": "object", "properties": {"x": {"type": "number"}}},
            "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]},
            "tags": {"type": "array", "items": {"type": "object", "properties": {}}},
            "free": {"type": "object"},
            "open": {"type": "object", "properties": {}, "additionalProperties": True},
            "maps": {"type": "object", "additionalProperties": {"type": "integer"}},
        },
        "$defs": {"node": {"properties": {"next": {"$ref": "#/$defs/node"}}}},
    }
    closed = strict_schema(nested)
    props = closed["properties"]
    assert closed["additionalProperties"] is False
    assert props["point"]["additionalProperties"] is False
    assert props["pair"]["items"] is False
    assert props["tags"]["items"]["additionalProperties"] is False
    assert "additionalProperties" not in props["free"]  # declares nothing: any object
    assert props["open"]["additionalProperties"] is True  # allowed explicitly
    assert props["maps"]["additionalProperties"] == {"type": "integer"}
    assert closed["$defs"]["node"]["additionalProperties"] is False
    either = strict_schema({"anyOf": [{"properties": {"a": {}}}, {"type": "integer"}]})
    assert either["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in nested  # a copy
    assert strict_schema(closed) == closed
    jsonschema.Draft202012Validator.check_schema(closed)
    jsonschema.validate({"point": {"x": 1}, "pair": ["a", 1], "free": {"z": 1}}, closed)
    for bad in ({"point": {"x": 1, "y": 2}}, {"pair": ["a", 1, 2]}, {"other": 1}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, closed)


def test_all_of_branches_stay_open_to_each_other():
    schema = {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}},
            {"type": "object", "properties": {"b": {"type": "object", "properties": {}}}},
        ]
    }
    closed = strict_schema(schema)
    assert "additionalProperties" not in closed["allOf"][0]
    assert closed["allOf"][1]["properties"]["b"]["additionalProperties"] is False
    jsonschema.validate({"a": 1, "b": {}}, closed)


def test_tool_arguments_are_strict_unless_the_tool_says_otherwise():
    request = ToolRequest.build(TOOLS, NAMED)
    assert request.constraint.json == strict_schema(WEATHER)
    lenient_tools = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "strict": False}}]
    lenient = ToolRequest.build(lenient_tools, NAMED)
    assert lenient.constraint.json == WEATHER
    assert "strict" not in lenient.tools[0]["function"]  # the template sees the tool as before
    required = ToolRequest.build(TOOLS, "required").constraint.json
    assert required["items"]["anyOf"][0]["properties"]["parameters"] == strict_schema(WEATHER)


def accepted(compiler, constraint, text: str) -> bool:
    matcher = compiler.compile(constraint)
    tokens = compiler.tokenizer.encode(text, add_special_tokens=False)
    return matcher.validate_tokens(tokens) == len(tokens)


def test_grammar_refuses_invented_properties(smollm2_tokenizer):
    compiler = grammar_compiler(smollm2_tokenizer, len(smollm2_tokenizer), [2])
    strict = StructuredOutputsParams(json=WEATHER)
    lenient = StructuredOutputsParams(json=WEATHER, strict=False)
    assert strict.key() != lenient.key()
    assert accepted(compiler, strict, '{"city":"Oslo","unit":"c"}')
    assert not accepted(compiler, strict, INVENTED)
    assert accepted(compiler, lenient, INVENTED)
    assert ToolRequest.build(TOOLS, NAMED).constraint.strict is False  # closed already
    assert accepted(compiler, StructuredOutputsParams(json_object=True), '{"any":[1,2]}')
    with pytest.raises(ValueError, match="strict"):
        StructuredOutputsParams(json=WEATHER, strict="no")
