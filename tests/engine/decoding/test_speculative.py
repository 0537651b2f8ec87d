"""Speculative decoding with n-gram prompt lookup on a tiny random Llama (fp32): token for token
the output of decoding without speculation, with sampled and penalised rows in the same steps,
through chunked prefill, preemption and the prefix cache; rejected tokens' pages returned. Sampled
rows' distribution: ``test_speculative_sampling.py``."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from jaxgen import LLM, SamplingParams
from jaxgen.config.engine_config import EngineConfig
from jaxgen.config.speculative_config import SpeculativeConfig
from tests.engine.decoding.speculation_workload import repeating_prompts, speculation_knobs

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}


@pytest.fixture(scope="module")
def knobs(tiny_loaded):
    return speculation_knobs(tiny_loaded.config)


@pytest.fixture(scope="module")
def plain(tiny_loaded, knobs):
    return LLM(tiny_loaded, **knobs)


@pytest.fixture(scope="module")
def speculating(tiny_loaded, knobs):
    return LLM(tiny_loaded, **knobs, speculative_config=NGRAM)


@pytest.fixture(scope="module")
def prompts():
    return repeating_prompts()


def greedy(max_tokens=64, **fields):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **fields)


def test_greedy_output_identical(plain, speculating, prompts):
    """Greedy rows (one with a stop string, one with a shorter max_tokens) speculate; a sampled
    row shares their steps; preemption, chunked prefill and the prefix cache all happen."""
    params = [
        greedy(),
        greedy(stop=["zz"]),
        greedy(max_tokens=45),
        SamplingParams(temperature=0.8, seed=3, max_tokens=50, ignore_eos=True),
    ]
    expected = plain.generate(prompts, params)
    got = speculating.generate(prompts, params)
    for want, have in zip(expected, got, strict=True):
        assert have.outputs[0].token_ids == want.outputs[0].token_ids
        assert have.outputs[0].text == want.outputs[0].text
        assert have.outputs[0].finish_reason == want.outputs[0].finish_reason
    stats = speculating.stats()
    assert stats["spec_decode_num_drafts"] > 0
    assert 0 < stats["spec_decode_num_accepted_tokens"] <= stats["spec_decode_num_draft_tokens"]
    assert stats["preemptions"] > 0
    assert stats["steps"] < plain.stats()["steps"]  # accepted tokens saved steps
    assert speculating.engine.scheduler.allocator.num_used_pages == 0  # rolled back, freed
    # The prefix cache holds only pages whose K/V match the tokens they are named by: a second
    # run, reusing cached pages, gives the same tokens.
    hits = stats["prefix_cache_hit_pages"]
    again = speculating.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in got]
    assert speculating.stats()["prefix_cache_hit_pages"] > hits


# Structured output: forced-length constraints (the tiny model would end an optional one at
# once) whose greedy output repeats, so prompt lookup drafts are accepted.
DIGITS = {
    "type": "object",
    "properties": {
        "a": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 9},
            "minItems": 8,
            "maxItems": 8,
        }
    },
    "required": ["a"],
    "additionalProperties": False,
}
CONSTRAINED = [
    ("x1x1x1x1", {"regex": "(x[0-9]){12}"}),
    ('{"a": [1, 2, 1, 2, 1, 2, 1, 2]}', {"json": DIGITS}),
    ("red green blue red green blue", {"choice": ["red green blue red green blue red", "blue"]}),
    ("abc abc abc abc abc", {"regex": "(abc |bca |cab ){10}"}),  # sampled, seeded
]


def test_structured_output_identical(plain, speculating, tiny_loaded):
    """Rows with a regex, a JSON schema and a choice speculate (greedy, and a seeded sampled
    one in the same steps): drafts cut to the grammar, each position sampled under its mask,
    the grammar ending the request on an accepted token. Token for token the output without
    speculation."""
    tokenizer = tiny_loaded.tokenizer
    prompts = [tokenizer.encode(text, add_special_tokens=False) for text, _ in CONSTRAINED]
    params = [greedy(max_tokens=48, structured_outputs=so) for _, so in CONSTRAINED[:3]]
    params.append(
        SamplingParams(temperature=0.8, seed=3, max_tokens=48, structured_outputs=CONSTRAINED[3][1])
    )
    before = speculating.stats()
    expected = plain.generate(prompts, params, use_tqdm=False)
    got = speculating.generate(prompts, params, use_tqdm=False)
    for want, have in zip(expected, got, strict=True):
        assert have.outputs[0].token_ids == want.outputs[0].token_ids
        assert have.outputs[0].text == want.outputs[0].text
        assert have.outputs[0].finish_reason == want.outputs[0].finish_reason == "stop"
    assert re.fullmatch("(x[0-9]){12}", got[0].outputs[0].text)
    assert len(json.loads(got[1].outputs[0].text)["a"]) == 8
    assert got[2].outputs[0].text == CONSTRAINED[2][1]["choice"][0]
    after = speculating.stats()
    assert after["spec_decode_num_accepted_tokens"] > before["spec_decode_num_accepted_tokens"]
    assert speculating.engine.grammars.matchers == {}
    assert speculating.engine.scheduler.allocator.num_used_pages == 0


def test_constrain_drafts(tiny_loaded):
    """A constrained draft is cut at the first token its grammar refuses and after the token
    that ends it, with the mask of each of its positions; the matcher is left where it was;
    unconstrained drafts pass unchanged, a draft refused from its first token is dropped."""
    from types import SimpleNamespace

    from jaxgen.engine.decoding.speculative.grammar_drafts import constrain_drafts
    from jaxgen.engine.decoding.speculative.speculator import Draft
    from jaxgen.engine.structured.grammar_masks import GrammarMasks, grammar_compiler
    from jaxgen.structured_outputs import StructuredOutputsParams

    tokenizer, config = tiny_loaded.tokenizer, tiny_loaded.config
    compiler = grammar_compiler(tokenizer, config.vocab_size, config.eos_token_ids)
    grammars = GrammarMasks(compiler)
    choice = StructuredOutputsParams(choice=["one two three", "four"])
    grammars.add([1, 2], compiler.compile(choice))
    words = tokenizer.encode("one two three", add_special_tokens=False)
    other = tokenizer.encode(" five", add_special_tokens=False)[0]
    eos = config.eos_token_ids[0]
    drafts = [
        Draft(SimpleNamespace(seq_id=1), words + [eos, other], 5),  # the grammar ends mid-draft
        Draft(SimpleNamespace(seq_id=2), [other, *words], 5),  # refused at once: dropped
        Draft(SimpleNamespace(seq_id=3), [other, other], 5),  # unconstrained
    ]
    kept, masks = constrain_drafts(drafts, grammars)
    assert [d.tokens for d in kept] == [words, [other, other]]
    assert list(masks) == [1] and masks[1].shape == (len(words) + 1, compiler.mask_width)
    bits = np.unpackbits(masks[1].view(np.uint8), axis=1, bitorder="little")  # [n + 1, V]
    for position, token in enumerate(words):
        assert bits[position, token] and not bits[position, other]
    assert np.flatnonzero(bits[-1]).tolist() == [eos]  # after the grammar's end: EOS only
    # The matcher was rolled back: it takes the draft again, token by token, to its end.
    assert [grammars.advance(1, token) for token in words] == [None] * (len(words) - 1) + ["stop"]


@pytest.mark.parametrize(
    "config,name",
    [
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 17}, "num_speculative_tokens"),
        ({"method": "eagle", "num_speculative_tokens": 2}, "method"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0}, "lookup_min"),
        (
            {
                "method": "ngram",
                "num_speculative_tokens": 2,
                "prompt_lookup_min": 4,
                "prompt_lookup_max": 2,
            },
            "prompt_lookup_min",
        ),
        ({"method": "ngram", "num_speculative_tokens": 2, "bogus": 1}, "bogus"),
        ("ngram", "speculative_config"),
    ],
)
def test_bad_config(config, name):
    with pytest.raises(ValueError, match=name):
        EngineConfig(speculative_config=config)


def test_needs_one_scheduler_step():
    with pytest.raises(ValueError, match="speculative_config"):
        EngineConfig(speculative_config=NGRAM, num_scheduler_steps=4)


def test_async_scheduling_output_identical(tiny_loaded, knobs, plain, prompts):
    """With asynchronous scheduling, steps that may carry drafts run synchronously and the
    others ahead: both happen, and the output is token for token the plain engine's."""
    llm = LLM(tiny_loaded, **knobs, speculative_config=NGRAM, async_scheduling=True)
    params = [
        greedy(),
        greedy(max_tokens=45),
        SamplingParams(temperature=0.8, seed=3, max_tokens=50, ignore_eos=True),
        greedy(),
    ]
    expected = plain.generate(prompts, params)
    got = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
    stats = llm.stats()
    assert stats["spec_decode_num_accepted_tokens"] > 0
    assert llm.engine.async_steps > 0
    assert llm.engine.scheduler.allocator.num_used_pages == 0


@pytest.mark.slow  # ~12 s: compiles the per-batch executables
def test_per_batch_executables_output_identical(tiny_loaded, knobs, plain, prompts):
    """With per-batch executables (a GPU's way: the step's sampler compiled for the batch's
    flags, the verify sampler with every stage on) the tokens are the plain engine's."""
    llm = LLM(tiny_loaded, **knobs, speculative_config=NGRAM, sampler_executables="per-batch")
    params = [greedy(max_tokens=40), SamplingParams(temperature=0.8, seed=5, max_tokens=16)]
    expected = plain.generate(prompts[:2], params)
    got = llm.generate(prompts[:2], params)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
    assert llm.stats()["spec_decode_num_accepted_tokens"] > 0


def test_config_defaults():
    config = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3})
    assert (config.prompt_lookup_min, config.prompt_lookup_max) == (5, 5)
    config = SpeculativeConfig.from_dict({"num_speculative_tokens": 3, "prompt_lookup_max": 4})
    assert (config.method, config.prompt_lookup_min, config.prompt_lookup_max) == ("ngram", 4, 4)


def test_metrics_and_flags(speculating):
    """``/metrics`` carries vLLM's spec-decode counters; ``--speculative-config`` takes JSON."""
    import argparse

    from prometheus_client import CollectorRegistry, generate_latest

    from jaxgen.config.knobs import add_engine_flags
    from serving.metrics import EngineStatsCollector

    registry = CollectorRegistry()
    registry.register(EngineStatsCollector(speculating.stats))
    text = generate_latest(registry).decode()
    drafts = speculating.stats()["spec_decode_num_drafts"]
    assert f"jaxgen_spec_decode_num_drafts_total {float(drafts)}" in text
    assert 'jaxgen_spec_decode_num_accepted_tokens_per_pos_total{position="0"}' in text
    parser = argparse.ArgumentParser()
    add_engine_flags(parser)
    args = parser.parse_args(["--speculative-config", '{"num_speculative_tokens": 3}'])
    assert args.speculative_config == {"num_speculative_tokens": 3}
    with pytest.raises(SystemExit):
        parser.parse_args(["--speculative-config", "[1]"])


def test_no_compiles_after_precompile(speculating, prompts, tiny_loaded):
    """Precompiling covers the verify steps (each step shape with each verify-row bucket) and
    their sampler: greedy, sampled and constrained speculation then compile nothing."""
    speculating.precompile()
    before = speculating.stats()
    sampled = SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_tokens=24, ignore_eos=True)
    speculating.generate(prompts, greedy(24), use_tqdm=False)
    speculating.generate(prompts, sampled, use_tqdm=False)
    drafts = speculating.stats()["spec_decode_num_drafts"]
    regex = greedy(32, structured_outputs={"regex": "(x[0-9]){15}"})  # masked draft positions
    x1 = tiny_loaded.tokenizer.encode("x1x1x1x1", add_special_tokens=False)
    speculating.generate([x1], regex, use_tqdm=False)
    after = speculating.stats()
    assert after["spec_decode_num_drafts"] > drafts
    assert after["compiles"] == before["compiles"]
    assert after["spec_decode_num_drafts"] > before["spec_decode_num_drafts"]


@pytest.mark.slow
def test_default_model_identical_on_reference_backend(smollm2_loaded):
    """The default model, input-grounded chat prompts (drafts get accepted), on the XLA
    reference backend (the tiny model's tests run the native CPU one): token for token the
    output without speculation."""
    tokenizer = smollm2_loaded.tokenizer
    code = "def area(width, height):\n    return width * height\n\nprint(area(3, 4))\n"
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"{task}\n\n{code}"}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for task in ("Repeat this code exactly:", "Rename `width` to `w` in this code:")
    ]
    token_lists = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=40)
    knobs = dict(max_model_len=256, max_rolling_batch_size=2, kv_cache_memory=16 << 20)
    for backend in ("reference",):
        plain = LLM(smollm2_loaded, **knobs, attention_backend=backend)
        expected = plain.generate(token_lists, params, use_tqdm=False)
        llm = LLM(smollm2_loaded, **knobs, attention_backend=backend, speculative_config=NGRAM)
        got = llm.generate(token_lists, params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in got] == [
            o.outputs[0].token_ids for o in expected
        ], backend
        assert llm.stats()["spec_decode_num_accepted_tokens"] > 0


def test_w4a8_greedy_output_identical(tiny_model_dir, knobs, prompts):
    """int4 weights with int8 activations (``quantization="w4a8"``, the native CPU kernel's
    integer products): a verify step's rows get the tokens decoding without speculation does."""
    from jaxgen.loaders import load_model

    loaded = load_model(tiny_model_dir, quantization="w4a8")
    plain = LLM(loaded, **knobs)
    assert any(name.startswith("int4") and name.endswith("/a8") for name in
               plain.stats()["weight_dtypes"])  # fmt: skip
    params = [greedy(), greedy(stop=["zz"]), greedy(max_tokens=45), greedy()]
    expected = plain.generate(prompts, params)
    speculating = LLM(loaded, **knobs, speculative_config=NGRAM)
    got = speculating.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
    assert speculating.stats()["spec_decode_num_accepted_tokens"] > 0


def test_server_setting_is_json():
    from serving.settings.resolve import SettingsError, resolve_settings

    settings = resolve_settings({"speculative_config": '{"num_speculative_tokens": 2}'}, {})
    assert settings.engine["speculative_config"] == {"num_speculative_tokens": 2}
    with pytest.raises(SettingsError, match="speculative_config"):
        resolve_settings({"speculative_config": "{not json"}, {})


def test_plan_verify():
    """``jaxgen plan --num-speculative-tokens``: the verify step's rows, logits, pages and
    compute bound; bad k is a ValueError naming the flag's field."""
    from jaxgen.engine.decoding.speculative.plan import expected_tokens, plan_verify

    plan = plan_verify(
        num_speculative_tokens=4,
        max_num_seqs=8,
        vocab_size=1000,
        page_size=16,
        context=64,
        num_pages=100,
        critical_batch_size=300.0,
    )
    assert plan.step_tokens == 40 and plan.extra_logits_rows == 32
    assert plan.extra_logits_bytes == 32 * 1000 * 4
    assert plan.extra_pages_per_sequence == 1
    assert plan.sequences_at_context == 100 // 5  # 4 pages of context + 1 for the draft
    assert plan.critical_sequences == 60.0
    assert expected_tokens(0.5, 4) == pytest.approx(1 + 0.5 + 0.25 + 0.125 + 0.0625)
    assert expected_tokens(1.0, 4) == 5.0
    for bad in (0, 17, 2.5, True):
        with pytest.raises(ValueError, match="num_speculative_tokens"):
            plan_verify(
                num_speculative_tokens=bad,
                max_num_seqs=8,
                vocab_size=1000,
                page_size=16,
                context=64,
                num_pages=100,
                critical_batch_size=300.0,
            )
