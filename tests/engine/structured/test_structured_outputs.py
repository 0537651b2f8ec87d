"""Constrained decoding in the engine: outputs match their JSON schema / regex / choice in every
batching mode, with chunked prefill, preemption and ``n > 1``; unconstrained neighbours are not
changed; no compile per schema; the device mask matches llguidance's numpy reference."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest

from jaxgen import LLM, SamplingParams
from jaxgen.engine.sampling.logit_processors import apply_token_bitmask

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "scores": {
            "type": "array",
            "items": {"type": "number", "minimum": -1, "maximum": 1, "multipleOf": 0.25},
            "maxItems": 3,
        },
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
REGEX = r"[0-9]{3}-[a-z]{2,4}"
CHOICES = ["red", "green", "blue"]
LONG = r"[a-z ]{60,70}"


def constrained_params(seed: int, **extra) -> list[SamplingParams]:
    """A JSON schema, a regex and a choice request, sampled at temperature 1."""
    common = dict(temperature=1.0, max_tokens=80, **extra)
    return [
        SamplingParams(seed=seed, structured_outputs={"json": PERSON}, **common),
        SamplingParams(seed=seed + 1, structured_outputs={"regex": REGEX}, **common),
        SamplingParams(seed=seed + 2, structured_outputs={"choice": CHOICES}, **common),
    ]


def check_constrained(outputs) -> None:
    """Each output (from ``constrained_params``' order) matches its constraint and ended with
    ``stop``."""
    for index, output in enumerate(outputs):
        kind = index % 3
        for sample in output.outputs:
            assert sample.finish_reason == "stop", (sample.text, sample.finish_reason)
            if kind == 0:
                jsonschema.validate(json.loads(sample.text), PERSON)
            elif kind == 1:
                assert re.fullmatch(REGEX, sample.text), sample.text
            else:
                assert sample.text in CHOICES


PROMPTS = [list(range(100, 100 + n)) for n in (9, 23, 40, 14, 31, 6)]


@pytest.fixture(scope="module")
def reference(tiny_loaded):
    """One request at a time: the tokens every batching mode must reproduce."""
    llm = LLM(tiny_loaded, batching="none", max_model_len=256)
    params = constrained_params(0) + constrained_params(10)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    check_constrained(outputs)
    return [output.outputs[0].token_ids for output in outputs]


@pytest.mark.slow
@pytest.mark.parametrize(
    "knobs",
    [
        dict(batching="static", batch_size=4),
        dict(batching="dynamic", batch_size=3, max_batch_delay=0.01),
        dict(batching="continuous", max_rolling_batch_size=4),
        dict(batching="paged"),
        dict(batching="paged", max_rolling_batch_prefill_tokens=16, max_rolling_batch_size=4),
    ],
    ids=["static", "dynamic", "continuous", "paged", "chunked-prefill"],
)
def test_every_batching_mode_matches_one_at_a_time(tiny_loaded, reference, knobs):
    llm = LLM(tiny_loaded, max_model_len=256, **knobs)
    outputs = llm.generate(PROMPTS, constrained_params(0) + constrained_params(10), use_tqdm=False)
    assert [output.outputs[0].token_ids for output in outputs] == reference
    assert llm.stats()["grammar_masked_rows"] > 0
    assert not llm.engine.grammars.matchers  # every matcher released


@pytest.mark.slow
def test_preemption_keeps_each_matcher(tiny_loaded):
    """Long constrained outputs in 8 pages: sequences are preempted, recomputed from their
    tokens, and their matchers carry on where they were."""
    params = [
        SamplingParams(temperature=1.0, seed=i, max_tokens=80, structured_outputs={"regex": LONG})
        for i in range(len(PROMPTS))
    ]
    reference = LLM(tiny_loaded, batching="none", max_model_len=128).generate(
        PROMPTS, params, use_tqdm=False
    )
    page_bytes = tiny_loaded.config.kv_bytes_per_token(4) * 16
    llm = LLM(
        tiny_loaded,
        max_model_len=128,
        kv_cache_memory=8 * page_bytes,
        enable_prefix_caching=False,
    )
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert llm.stats()["preemptions"] > 0
    assert [o.outputs[0].token_ids for o in outputs] == [r.outputs[0].token_ids for r in reference]
    assert all(re.fullmatch(LONG, o.outputs[0].text) for o in outputs)


@pytest.mark.slow
def test_parallel_samples_have_a_matcher_each(smollm2_llm):
    outputs = smollm2_llm.generate(PROMPTS[:3], constrained_params(5, n=4), use_tqdm=False)
    check_constrained(outputs)
    texts = [sample.text for sample in outputs[0].outputs]
    assert len(set(texts)) > 1, texts  # seeds differ per sample


@pytest.mark.slow  # 13-30 s on 2 cores: the default suite stays near 15 min
def test_unconstrained_outputs_unchanged_by_constrained_neighbours(smollm2_llm):
    free = [
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=7, max_tokens=12, ignore_eos=True),
    ]
    alone = smollm2_llm.generate(PROMPTS[:2], free, use_tqdm=False)
    mixed = smollm2_llm.generate(
        PROMPTS[:2] + PROMPTS[2:5], free + constrained_params(3), use_tqdm=False
    )
    assert [o.outputs[0].token_ids for o in mixed[:2]] == [o.outputs[0].token_ids for o in alone]
    check_constrained(mixed[2:])


@pytest.mark.slow
def test_logits_wider_than_the_tokenizer(tmp_path, smollm2_tokenizer):
    """Ids past the tokenizer's vocabulary have no text: a constrained row never samples them."""
    from jaxgen.loaders import load_model
    from tests.family_models import save_tiny_model

    wide = len(smollm2_tokenizer) + 45
    loaded = load_model(save_tiny_model(str(tmp_path), smollm2_tokenizer, vocab_size=wide))
    llm = LLM(loaded, max_model_len=256)
    assert llm.engine.grammars.compiler.vocab_size == wide
    outputs = llm.generate(PROMPTS[:3], constrained_params(1), use_tqdm=False)
    check_constrained(outputs)


def test_no_compile_per_schema(smollm2_llm):
    """After one constrained request, ten different schemas compile nothing."""
    prompt = "Describe a user as JSON."

    def schema(i: int) -> dict:
        return {
            "type": "object",
            "properties": {f"field_{i}": {"type": "integer", "minimum": 0, "maximum": i + 1}},
            "required": [f"field_{i}"],
            "additionalProperties": False,
        }

    def params(i):
        return SamplingParams(
            temperature=0.0, max_tokens=24, structured_outputs={"json": schema(i)}
        )

    smollm2_llm.generate([prompt], params(100), use_tqdm=False)  # warm-up
    before = smollm2_llm.stats()["compiles"]
    for i in range(10):
        [output] = smollm2_llm.generate([prompt], params(i), use_tqdm=False)
        jsonschema.validate(json.loads(output.outputs[0].text), schema(i))
    assert smollm2_llm.stats()["compiles"] == before


def test_bad_constraints_raise_naming_the_field(smollm2_llm):
    bad = [
        ({"json": {"type": "object", "properties": {"a": {"type": "frobnicate"}}}}, "json"),
        ({"json": {"$ref": "https://example.com/schema.json"}}, "json"),  # remote $ref
        ({"regex": "a(b"}, "regex"),
        ({"grammar": "start: undefined_rule"}, "grammar"),
    ]
    for constraint, field in bad:
        with pytest.raises(ValueError, match=f"^{field}:"):
            smollm2_llm.generate(
                ["x"], SamplingParams(structured_outputs=constraint), use_tqdm=False
            )
    assert not smollm2_llm.engine.requests  # nothing was queued
    [output] = smollm2_llm.generate(
        ["The answer is"],
        SamplingParams(temperature=0.0, max_tokens=4, structured_outputs={"choice": ["yes", "no"]}),
        use_tqdm=False,
    )
    assert output.outputs[0].text in ("yes", "no")


def test_grammar_and_json_object(smollm2_llm):
    grammar = 'start: "x=" NUMBER ";"\nNUMBER: /[1-9][0-9]{0,2}/'
    outputs = smollm2_llm.generate(
        ["Assign:", "An object:"],
        [
            SamplingParams(temperature=0.0, max_tokens=20, structured_outputs={"grammar": grammar}),
            SamplingParams(
                temperature=0.0, max_tokens=60, structured_outputs={"json_object": True}
            ),
        ],
        use_tqdm=False,
    )
    assert re.fullmatch(r"x=[1-9][0-9]{0,2};", outputs[0].outputs[0].text)
    if outputs[1].outputs[0].finish_reason == "stop":
        assert isinstance(json.loads(outputs[1].outputs[0].text), dict)
    else:
        assert outputs[1].outputs[0].text.startswith("{")


def test_device_mask_matches_numpy_reference():
    from llguidance.numpy import apply_token_bitmask_inplace

    rng = np.random.default_rng(0)
    batch, vocab, width = 4, 100, 3  # 96 mask bits: ids 96..99 are past the mask
    logits = rng.normal(size=(batch, vocab)).astype(np.float32)
    bitmask = rng.integers(-(2**31), 2**31, size=(batch, width), dtype=np.int64).astype(np.int32)
    constrained = np.array([True, False, True, True])
    expected = logits.copy()
    masked = logits[constrained].copy()
    apply_token_bitmask_inplace(masked, bitmask[constrained])
    expected[constrained] = masked
    got = apply_token_bitmask(jnp.asarray(logits), jnp.asarray(bitmask), jnp.asarray(constrained))
    np.testing.assert_array_equal(np.asarray(got), expected)
    assert np.all(np.isneginf(np.asarray(got)[constrained, 96:]))


NO_TORCH = """
import sys
sys.modules["torch"] = None
from jaxgen.engine.structured.grammar_masks import GrammarCompiler
from jaxgen.loaders.default_model import default_model_path
from jaxgen.loaders.tokenizer import load_tokenizer
from jaxgen.structured_outputs import StructuredOutputsParams
tokenizer = load_tokenizer(default_model_path())
compiler = GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
matcher = compiler.compile(StructuredOutputsParams(json={"type": "object"})).deep_copy()
assert matcher.consume_token(tokenizer.encode("{", add_special_tokens=False)[0])
assert "torch" not in {name.split(".")[0] for name, mod in sys.modules.items() if mod is not None}
"""


@pytest.mark.slow
def test_grammars_need_no_torch():
    result = subprocess.run([sys.executable, "-c", NO_TORCH], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_compiler_takes_gbnf_and_caches_by_constraint(smollm2_tokenizer):
    from jaxgen.engine.structured.grammar_masks import GrammarCompiler
    from jaxgen.structured_outputs import StructuredOutputsParams

    tokenizer = smollm2_tokenizer
    compiler = GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    gbnf = StructuredOutputsParams(grammar='root ::= "ab" [0-9]')
    matcher = compiler.compile(gbnf).deep_copy()
    for token in tokenizer.encode("ab7", add_special_tokens=False):
        assert matcher.consume_token(token)
    assert matcher.is_stopped()
    same = StructuredOutputsParams(json='{"type": "object", "required": ["a"]}')
    first = compiler.compile(same)
    assert (
        compiler.compile(StructuredOutputsParams(json={"required": ["a"], "type": "object"}))
        is first
    )
    assert compiler.num_compiled == 2


# -- limits and the dry run: what is refused before a request is queued -------------------------
def chain(num_rules: int) -> str:
    rules = "".join(f'r{i} ::= "a" r{i + 1} | "b"\n' for i in range(num_rules))
    return f'root ::= r0\n{rules}r{num_rules} ::= "c"\n'


@pytest.mark.parametrize(
    "constraint, limit",
    [
        ({"grammar": chain(4500)}, "max_grammar_rules"),
        ({"grammar": chain(40)}, "max_constraint_depth"),
        ({"grammar": "start: " + "(" * 40 + '"a"' + ")" * 40}, "max_constraint_depth"),
        ({"grammar": "root ::= " + '"a" ' * 70_000}, "max_constraint_bytes"),
        ({"regex": "(" * 40 + "a" + ")" * 40}, "max_constraint_depth"),
        ({"choice": [f"c{i}" for i in range(50_001)]}, "max_enum_values"),
        (
            {"json": {"enum": list(range(30_000)), "anyOf": [{"const": i} for i in range(20_001)]}},
            "max_enum_values",
        ),
        ({"json": {"properties": {f"p{i}": {} for i in range(5001)}}}, "max_schema_properties"),
        ({"json": json.loads('{"items": ' * 33 + "{}" + "}" * 33)}, "max_constraint_depth"),
    ],
    ids=lambda value: value if isinstance(value, str) else next(iter(value)),
)
def test_limits_refuse_before_compiling(constraint, limit):
    from jaxgen.structured_outputs import StructuredOutputsParams
    from jaxgen.structured_outputs.limits import (
        ConstraintTooLarge,
        StructuredOutputLimits,
        check_constraint,
    )

    params = StructuredOutputsParams(**constraint)
    # 50,000 enum values take more than the default 256 KiB: the byte limit is raised for them
    others = {"max_constraint_bytes": 1 << 26} if limit == "max_enum_values" else {}
    with pytest.raises(ConstraintTooLarge, match=f"^{params.kind}: .*\\({limit}\\)$") as error:
        check_constraint(params, StructuredOutputLimits(**others))
    assert error.value.limit == limit
    try:  # within a raised limit, this one no longer refuses it
        check_constraint(params, StructuredOutputLimits(**others, **{limit: 10**7}))
    except ConstraintTooLarge as other:
        assert other.limit != limit


def test_grammar_shape_reads_rules_and_references():
    from jaxgen.structured_outputs.limits import grammar_shape

    gbnf = (
        "# a comment naming value object\n"
        'root   ::= value\nvalue  ::= object | "[" value "]" | [a-z"]+\n'
        'object ::= "{" (member ("," member)*)? "}"\nmember ::= "\\"root\\"" ":" value\n'
    )
    shape = grammar_shape(gbnf)
    # root -> value <-> object <-> member: one cycle; strings, classes and comments skipped
    assert (shape.rules, shape.chain_depth, shape.group_depth) == (4, 2, 2)
    lark = 'start: a b\na: "x" | b\nb: C /[ab]+/ // c\nC: "c"\n%ignore C\n'
    assert grammar_shape(lark) == type(shape)(rules=4, group_depth=0, chain_depth=4)
    assert grammar_shape(chain(10)).chain_depth == 12


@pytest.mark.parametrize(
    "constraint, words",
    [
        ({"json": {"$ref": "#"}}, "admits no output"),
        ({"json": {"allOf": [{"$ref": "#"}]}}, "admits no output"),
        (
            {"json": {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}},
            "cannot be followed",
        ),
        (
            {"grammar": "start: " + " | ".join(f'"option{i}"' for i in range(2500))},
            "Current row has 2501 items",
        ),
        ({"regex": "(a{1000}){1000}"}, "too many expressions"),
    ],
)
def test_compiler_refuses_what_it_cannot_follow(smollm2_tokenizer, constraint, words):
    """The dry run: a constraint that admits no output, or that llguidance's parser gives up on
    within its first tokens, is a ``ValueError`` naming its field, not a request that fails."""
    from jaxgen.engine.structured.grammar_masks import GrammarCompiler
    from jaxgen.structured_outputs import StructuredOutputsParams
    from jaxgen.structured_outputs.limits import StructuredOutputLimits

    tokenizer = smollm2_tokenizer
    compiler = GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    params = StructuredOutputsParams(**constraint)
    limits = StructuredOutputLimits(max_grammar_rules=5000)
    with pytest.raises(ValueError, match=f"^{params.kind}: .*{re.escape(words)}"):
        compiler.compile(params, limits)
    assert compiler.cached(params) is None and compiler.num_compiled == 0


def test_queued_compiles_are_bounded_and_cancellable():
    import threading

    from jaxgen.engine.structured.grammar_threads import GrammarThreads, QueueFull

    threads = GrammarThreads(1, max_pending=2, name="test")
    release = threading.Event()
    ran = []
    first = threads.submit(lambda: release.wait(10) and ran.append("first"))
    second = threads.submit(ran.append, "second")
    with pytest.raises(QueueFull):
        threads.submit(ran.append, "third")
    assert second.cancel()  # still queued
    release.set()
    first.result(10)
    assert threads.run(ran.append, "fourth") is None and ran == ["first", "fourth"]
    threads.shutdown()
