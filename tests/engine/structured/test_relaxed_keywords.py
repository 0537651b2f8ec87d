"""JSON Schema keywords llguidance cannot enforce (``oneOf`` it cannot prove disjoint,
``propertyNames``, ``uniqueItems``, ``not``, unknown formats, ``if``/``then``,
``minProperties`` beside optional properties) are read leniently rather than refused: the
request runs, its output matches the rest of the schema, and ``RequestOutput.relaxed_keywords``
names what was left out. (Property dependencies are enforced up to a bound:
``tests/api/test_schema_dependencies.py``.)"""

from __future__ import annotations

import json

import jsonschema
import pytest

from jaxgen import SamplingParams
from jaxgen.engine.structured.grammar_masks import GrammarCompiler
from jaxgen.structured_outputs import StructuredOutputsParams
from jaxgen.structured_outputs.relaxations import relaxed_keywords

DIGIT = {"type": "integer", "minimum": 0, "maximum": 9}
FLAG = {"type": "boolean"}
PAIR = {"type": "object", "properties": {"a": DIGIT, "b": FLAG}, "required": ["a"]}

# (schema, the keywords it relaxes, the schema its output must match: without them)
CASES = {
    "oneOf": (
        {"oneOf": [{**DIGIT, "maximum": 6}, {**DIGIT, "minimum": 3}]},
        ["oneOf"],
        {"anyOf": [{**DIGIT, "maximum": 6}, {**DIGIT, "minimum": 3}]},
    ),
    "propertyNames": ({**PAIR, "propertyNames": {"maxLength": 1}}, ["propertyNames"], PAIR),
    "uniqueItems": (
        {"type": "array", "items": DIGIT, "maxItems": 3, "uniqueItems": True},
        ["uniqueItems"],
        {"type": "array", "items": DIGIT, "maxItems": 3},
    ),
    "not": ({**DIGIT, "not": {"const": 5}}, ["not"], DIGIT),
    "format": (
        {"type": "string", "format": "hex-color", "maxLength": 7},
        ["format: hex-color"],
        {"type": "string", "maxLength": 7},
    ),
    "if": (
        {**PAIR, "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}},
        ["if", "then"],
        PAIR,
    ),
    "minProperties": (
        {"type": "object", "properties": {"a": FLAG, "b": FLAG, "c": FLAG}, "minProperties": 2},
        ["minProperties/maxProperties"],
        {"type": "object", "properties": {"a": FLAG, "b": FLAG, "c": FLAG}},
    ),
}


@pytest.fixture(scope="module")
def compiler(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    return GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])


@pytest.mark.parametrize("case", CASES)
def test_compiles_leniently_naming_the_keyword(compiler, case):
    schema, keywords, _ = CASES[case]
    matcher = compiler.compile(StructuredOutputsParams(json=schema))
    assert relaxed_keywords(matcher) == keywords


def test_outputs_match_what_is_enforced(smollm2_llm):
    prompts = [f"Reply with JSON ({case}):" for case in CASES]
    params = [
        SamplingParams(temperature=0.0, max_tokens=40, structured_outputs={"json": schema})
        for schema, _, _ in CASES.values()
    ]
    outputs = smollm2_llm.generate(prompts, params, use_tqdm=False)
    finished = 0
    for output, (_, keywords, enforced) in zip(outputs, CASES.values(), strict=True):
        assert output.relaxed_keywords == keywords
        if output.finish_reason == "stop":
            finished += 1
            jsonschema.validate(json.loads(output.text), enforced)
    assert finished >= len(CASES) - 1  # 40 tokens finish these small values
    [plain] = smollm2_llm.generate(
        ["A digit as JSON:"],
        SamplingParams(temperature=0.0, max_tokens=8, structured_outputs={"json": DIGIT}),
        use_tqdm=False,
    )
    assert plain.relaxed_keywords == []  # nothing left out


def test_a_schema_may_refuse_to_be_relaxed(compiler):
    schema = {**CASES["uniqueItems"][0], "x-guidance": {"lenient": False}}
    with pytest.raises(ValueError, match=r'^json: Unimplemented keys: \["uniqueItems"\]'):
        compiler.compile(StructuredOutputsParams(json=schema))


def test_what_lenience_cannot_mend_is_still_refused(compiler):
    with pytest.raises(ValueError, match="^json: .*look-around"):
        compiler.compile(StructuredOutputsParams(json={"type": "string", "pattern": "(?=a)b"}))
