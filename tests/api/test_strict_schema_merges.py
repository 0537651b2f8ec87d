"""Strict schemas never change whether a schema admits a value: where object schemas meet
(``allOf`` branches, a ``$ref`` and its siblings, ``anyOf`` beside properties), none is closed
by itself; the merged object is closed once, or left open when its names are not all known."""

from __future__ import annotations

import jsonschema
import pytest

from jaxgen.engine.structured.grammar_masks import GrammarCompiler
from jaxgen.structured_outputs import StructuredOutputsParams
from jaxgen.structured_outputs.strict_schemas import strict_schema

# JSONSchemaBench's JsonSchemaStore/jasmine.json, cut down: a root allOf of $refs into
# definitions; one requires spec_dir, the other declares properties of its own.
JASMINE = {
    "$schema": "http://json-schema.org/draft-04/schema#",
    "allOf": [
        {"$ref": "#/definitions/root-items"},
        {"type": "object", "properties": {"env": {"$ref": "#/definitions/env-items"}}},
        {"$ref": "#/definitions/env-items"},
    ],
    "definitions": {
        "root-items": {
            "type": "object",
            "required": ["spec_dir", "spec_files"],
            "properties": {
                "spec_dir": {"type": "string", "maxLength": 8},
                "spec_files": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
            },
        },
        "env-items": {"type": "object", "properties": {"random": {"type": "boolean"}}},
    },
}


def valid(instance, schema) -> bool:
    return jsonschema.validators.validator_for(schema)(schema).is_valid(instance)


def test_all_of_of_refs_stays_satisfiable_and_closed_once():
    closed = strict_schema(JASMINE)
    for name in ("root-items", "env-items"):  # branches: not closed by themselves
        assert "additionalProperties" not in closed["definitions"][name]
    jsonschema.validators.validator_for(closed).check_schema(closed)
    good = {"spec_dir": "s", "spec_files": [], "random": True, "env": {"random": False}}
    assert valid(good, JASMINE) and valid(good, closed)
    assert valid({**good, "invented": 1}, JASMINE)
    assert not valid({**good, "invented": 1}, closed)  # the merged object is closed
    assert not valid({**good, "env": {"random": True, "x": 1}}, closed)  # env too, via its $ref
    assert strict_schema(closed) == closed


def test_grammar_of_the_merged_object(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    compiler = GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    matcher = compiler.compile(StructuredOutputsParams(json=JASMINE))

    def accepts(text: str) -> bool:
        tokens = tokenizer.encode(text, add_special_tokens=False)
        return matcher.validate_tokens(tokens) == len(tokens)

    assert accepts('{"spec_dir":"s","spec_files":[],"random":true}')
    assert not accepts('{"spec_dir":"s","spec_files":[],"invented":1}')


def test_nested_properties_meet_and_are_closed_together():
    schema = {
        "allOf": [
            {"properties": {"x": {"properties": {"p": {"type": "integer"}}}}},
            {
                "properties": {"x": {"properties": {"q": {"type": "integer"}}, "required": ["q"]}},
                "required": ["x"],
            },
        ]
    }
    closed = strict_schema(schema)
    assert valid({"x": {"p": 1, "q": 2}}, closed)
    assert not valid({"x": {"q": 2, "r": 3}}, closed)
    assert not valid({"x": {"q": 2}, "y": 1}, closed)


def test_definition_used_alone_and_as_a_branch():
    schema = {
        "$defs": {"base": {"properties": {"id": {"type": "integer"}}, "required": ["id"]}},
        "properties": {
            "alone": {"$ref": "#/$defs/base"},
            "extended": {
                "allOf": [
                    {"$ref": "#/$defs/base"},
                    {"properties": {"name": {"type": "string"}}, "required": ["name"]},
                ]
            },
        },
    }
    closed = strict_schema(schema)
    assert "additionalProperties" not in closed["$defs"]["base"]
    assert valid({"alone": {"id": 1}, "extended": {"id": 1, "name": "n"}}, closed)
    assert not valid({"alone": {"id": 1, "name": "n"}}, closed)  # closed where used alone
    assert not valid({"extended": {"id": 1, "name": "n", "other": 0}}, closed)


def test_alternatives_beside_properties_and_alone():
    beside = {
        "properties": {"kind": {"type": "string"}},
        "anyOf": [{"properties": {"a": {}}, "required": ["a"]}, {"required": ["b"]}],
    }
    closed = strict_schema(beside)
    assert valid({"kind": "k", "a": 1}, closed) and valid({"b": 1}, closed)
    assert not valid({"kind": "k", "a": 1, "c": 1}, closed)
    alone = strict_schema({"anyOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]})
    assert [branch["additionalProperties"] for branch in alone["anyOf"]] == [False, False]


@pytest.mark.parametrize(
    "schema, instance",
    [
        # a required property the schema never declares
        ({"properties": {"a": {}}, "required": ["a", "z"]}, {"a": 1, "z": 2}),
        # more properties needed than declared
        ({"properties": {"a": {}}, "minProperties": 2}, {"a": 1, "b": 2}),
        # a property the other branch allows by additionalProperties
        (
            {"allOf": [{"additionalProperties": {"type": "integer"}}, {"properties": {"a": {}}}]},
            {"a": 1, "b": 2},
        ),
        # recursion through a branch
        (
            {
                "$defs": {"node": {"properties": {"next": {"$ref": "#/$defs/node"}}}},
                "allOf": [{"$ref": "#/$defs/node"}, {"properties": {"v": {}}, "required": ["v"]}],
            },
            {"v": 1, "next": {"next": {}}},
        ),
    ],
)
def test_still_admits_what_it_admitted(schema, instance):
    assert valid(instance, schema)
    assert valid(instance, strict_schema(schema))


def test_unknown_names_leave_the_merged_object_open():
    remote = {"allOf": [{"$ref": "other.json#/a"}, {"properties": {"a": {}}}]}
    assert strict_schema(remote) == remote  # what other.json declares is not known
    patterns = {"allOf": [{"patternProperties": {"^x": {}}}, {"properties": {"a": {}}}]}
    assert strict_schema(patterns) == patterns


def test_conditions_are_left_as_they_are():
    schema = {
        "properties": {"a": {"type": "integer"}},
        "not": {"properties": {"a": {"const": 1}}},
        "if": {"properties": {"a": {"const": 2}}},
        "then": {"required": ["a"]},
    }
    closed = strict_schema(schema)
    assert closed["not"] == schema["not"] and closed["if"] == schema["if"]
    assert valid({"a": 2}, closed) and not valid({"a": 1}, closed)
