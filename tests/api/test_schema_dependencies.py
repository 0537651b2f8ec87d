"""Property dependencies (``dependentRequired``, ``dependentSchemas``, draft 7's
``dependencies``) are enforced, not relaxed: the compiled grammar accepts exactly the instances
``jsonschema`` finds valid, read strictly or not, nested, chained, on a required property, in
tool calls' arguments; past ``MAX_CONDITIONAL_DEPENDENCIES`` (or llguidance's size limit at one
place) an object's dependencies are relaxed and reported, as before."""

from __future__ import annotations

import itertools
import json

import jsonschema
import pytest

from jaxgen import SamplingParams
from jaxgen.engine.structured.grammar_masks import GrammarCompiler
from jaxgen.structured_outputs import StructuredOutputsParams
from jaxgen.structured_outputs.dependencies import (
    KEYWORDS,
    MAX_CONDITIONAL_DEPENDENCIES,
    enforced_dependencies,
)
from jaxgen.structured_outputs.relaxations import relaxed_keywords
from jaxgen.structured_outputs.strict_schemas import strict_schema
from jaxgen.tool_calling import ToolChoice, tool_choice_constraint

DRAFT_7 = "http://json-schema.org/draft-07/schema#"
DRAFT_2020 = "https://json-schema.org/draft/2020-12/schema"
INT = {"type": "integer"}
ABC = {"a": INT, "b": INT, "c": INT}


def obj(properties=ABC, **keywords) -> dict:
    return {"type": "object", "properties": properties, **keywords}


# name -> (schema, the properties its instances take, in declared order: llguidance keeps it)
CASES = {
    "dependentRequired": (obj(dependentRequired={"a": ["b"]}), "abc"),
    "dependencies array": (obj(dependencies={"a": ["b", "c"]}, **{"$schema": DRAFT_7}), "abc"),
    "dependencies schema": (
        obj(
            dependencies={"a": {"properties": {"b": {"minimum": 5}}, "required": ["b"]}},
            **{"$schema": DRAFT_7},
        ),
        "abc",
    ),
    "dependentSchemas": (
        obj(dependentSchemas={"b": {"properties": {"c": {"maximum": 3}}, "required": ["c"]}}),
        "abc",
    ),
    "both on one name": (
        obj(dependentRequired={"a": ["b"]}, dependentSchemas={"a": {"required": ["c"]}}),
        "abc",
    ),
    "chain a->b->c": (obj(dependentRequired={"a": ["b"], "b": ["c"]}), "abc"),
    "already required": (obj(required=["a"], dependentRequired={"a": ["b"]}), "abc"),
    "false schema": (obj(dependentSchemas={"c": False}), "abc"),
    "no type": ({"properties": ABC, "dependentRequired": {"c": ["a"]}}, "abc"),
    "four at once": (
        obj(
            {name: INT for name in "abcdef"},
            dependentRequired={"a": ["b"], "c": ["d"], "e": ["f"], "f": ["a"]},
        ),
        "abcdef",
    ),
}


def valid(instance, schema) -> bool:
    return jsonschema.validators.validator_for(schema)(schema).is_valid(instance)


def instances(names: str, values=(1, 7)) -> list:
    """Every object over ``names`` (in order) with each value, and two non-objects."""
    found = [3, "x"]
    for n in range(len(names) + 1):
        for chosen in itertools.combinations(names, n):
            found += [dict.fromkeys(chosen, value) for value in values]
    return found


@pytest.fixture(scope="module")
def compiler(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    return GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])


def accepts(compiler, matcher, instance) -> bool:
    """Whether ``matcher`` takes ``instance``'s compact JSON whole and may end there."""
    probe = matcher.deep_copy()
    text = json.dumps(instance, separators=(",", ":"))
    tokens = compiler.tokenizer.encode(text, add_special_tokens=False)
    if probe.validate_tokens(tokens) != len(tokens):
        return False
    probe.consume_tokens(tokens)
    return probe.is_accepting()


def check_enforced(compiler, constraint, schema, candidates) -> None:
    """``constraint`` compiles with nothing relaxed and accepts exactly what ``schema``
    admits among ``candidates`` (some of each)."""
    matcher = compiler.compile(constraint)
    assert relaxed_keywords(matcher) == []
    verdicts = [valid(instance, schema) for instance in candidates]
    assert True in verdicts and False in verdicts
    for instance, verdict in zip(candidates, verdicts, strict=True):
        assert accepts(compiler, matcher, instance) == verdict, (instance, verdict)


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
@pytest.mark.parametrize("case", CASES)
def test_grammar_accepts_what_jsonschema_does(compiler, case, strict):
    schema, names = CASES[case]
    reading = strict_schema(schema) if strict else schema  # what jsonschema checks
    candidates = instances(names) + ([{"a": 1, "z": 2}, {"z": 2}] if strict else [])
    check_enforced(
        compiler, StructuredOutputsParams(json=schema, strict=strict), reading, candidates
    )


@pytest.mark.parametrize("case", CASES)
def test_the_rewrite_says_the_same(case):
    schema, names = CASES[case]
    rewritten = enforced_dependencies(schema)
    assert not set(KEYWORDS) & set(rewritten)
    jsonschema.validators.validator_for(rewritten).check_schema(rewritten)
    for instance in instances(names):
        assert valid(instance, rewritten) == valid(instance, schema), instance
    assert enforced_dependencies(rewritten) == rewritten
    assert schema == CASES[case][0]  # the request's schema is left as it was


def test_a_required_property_adds_its_needs_without_alternatives():
    rewritten = enforced_dependencies(CASES["already required"][0])
    assert rewritten["required"] == ["a", "b"] and "allOf" not in rewritten
    chained = obj(required=["a"], dependentRequired={"b": ["c"], "a": ["b"]})
    rewritten = enforced_dependencies(chained)  # b is required through a: so is c
    assert rewritten["required"] == ["a", "b", "c"] and "allOf" not in rewritten


@pytest.mark.parametrize(
    ("uri", "kept"), [(DRAFT_7, "dependentRequired"), (DRAFT_2020, "dependencies"), (None, None)]
)
def test_only_the_drafts_own_keywords_are_read(uri, kept):
    schema = obj(dependentRequired={"a": ["b"]}, dependencies={"b": ["c"]})
    readings = [{**schema, "$schema": uri}] if uri else [{**schema, "$schema": DRAFT_7}]
    readings += [] if uri else [{**schema, "$schema": DRAFT_2020}]  # none named: both drafts'
    rewritten = enforced_dependencies(readings[0] if uri else schema)
    assert [key for key in KEYWORDS if key in rewritten] == ([kept] if kept else [])
    for instance in instances("abc"):
        expected = all(valid(instance, reading) for reading in readings)
        assert valid(instance, {**rewritten, "$schema": uri or DRAFT_2020}) == expected, instance


def test_nested_objects_are_rewritten(compiler):
    inner = obj(dependentRequired={"a": ["c"]})
    schema = {
        "type": "object",
        "$defs": {"inner": inner},
        "properties": {
            "one": {"$ref": "#/$defs/inner"},
            "many": {"type": "array", "items": obj(dependentSchemas={"b": {"required": ["a"]}})},
        },
        "required": ["one"],
    }
    candidates = [{"one": one} for one in instances("abc", values=(1,)) if isinstance(one, dict)]
    candidates += [{"one": {}, "many": [many]} for many in instances("ab", values=(1,))]
    assert "allOf" in enforced_dependencies(schema)["$defs"]["inner"]
    check_enforced(
        compiler, StructuredOutputsParams(json=schema), strict_schema(schema), candidates
    )


def test_strict_closing_is_kept_beside_pattern_properties(compiler):
    schema = obj(patternProperties={"^x": INT}, dependentRequired={"a": ["b"]})
    candidates = [{"a": 1, "b": 2}, {"a": 1}, {"a": 1, "b": 2, "x1": 3}, {"b": 1, "y": 3}]
    check_enforced(
        compiler, StructuredOutputsParams(json=schema), strict_schema(schema), candidates
    )


def test_a_dependent_schema_declaring_new_properties_stays_satisfiable(compiler):
    schema = obj({"a": INT}, dependentSchemas={"a": {"properties": {"d": INT}, "required": ["d"]}})
    candidates = [{}, {"a": 1}, {"a": 1, "d": 2}, {"d": 2}, {"a": 1, "d": 2, "z": 3}]
    check_enforced(
        compiler, StructuredOutputsParams(json=schema), strict_schema(schema), candidates
    )


def test_tool_arguments_enforce_dependencies(compiler):
    parameters = obj(dependentRequired={"a": ["b"]})
    tools = [{"type": "function", "function": {"name": "f", "parameters": parameters}}]
    named = tool_choice_constraint(tools, ToolChoice(mode="named", name="f"))
    candidates = [{"a": 1}, {"a": 1, "b": 2}, {"b": 2}, {"a": 1, "b": 2, "z": 3}]
    check_enforced(compiler, named, strict_schema(parameters), candidates)
    required = tool_choice_constraint(tools, ToolChoice(mode="required"), frozenset({"f"}))
    calls = [[{"name": "f", "parameters": arguments}] for arguments in candidates]
    check_enforced(compiler, required, required.schema(dependencies=False), calls)


def test_more_than_the_bound_is_relaxed_as_before(compiler):
    names = "abcdefghijkl"
    dependent = {names[i]: [names[i + 6]] for i in range(MAX_CONDITIONAL_DEPENDENCIES + 1)}
    schema = obj({name: INT for name in names}, dependentRequired=dependent)
    assert enforced_dependencies(schema) == schema
    matcher = compiler.compile(StructuredOutputsParams(json=schema))
    assert relaxed_keywords(matcher) == ["dependentRequired"]
    assert not valid({"a": 1}, schema) and accepts(compiler, matcher, {"a": 1})


def test_too_many_alternatives_at_one_place_are_relaxed(compiler):
    names = [f"p{i}" for i in range(24)]

    def part(first: int) -> dict:  # four conditional dependencies: the bound allows them
        return {"dependentRequired": {names[i]: [names[i + 1]] for i in range(first, first + 8, 2)}}

    schema = obj({name: INT for name in names}, allOf=[part(0), part(8), part(16)])
    matcher = compiler.compile(StructuredOutputsParams(json=schema))  # 4,096 alternatives
    assert relaxed_keywords(matcher) == ["dependentRequired"]
    assert accepts(compiler, matcher, {"p0": 1}) and not valid({"p0": 1}, schema)


def test_outputs_match_their_dependencies(smollm2_llm):
    schema = obj(
        {
            "name": {"type": "string", "maxLength": 8},
            "email": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 99},
        },
        dependentRequired={"name": ["age"]},
        dependentSchemas={"email": {"required": ["name"]}},
    )
    params = [
        SamplingParams(
            temperature=1.0, seed=seed, max_tokens=48, structured_outputs={"json": schema}
        )
        for seed in range(4)
    ]
    outputs = smollm2_llm.generate(["A person as JSON:"] * 4, params, use_tqdm=False)
    finished = [output for output in outputs if output.finish_reason == "stop"]
    assert finished
    for output in outputs:
        assert output.relaxed_keywords == []
    for output in finished:
        jsonschema.Draft202012Validator(strict_schema(schema)).validate(json.loads(output.text))
