"""Speculative decoding with a draft model on tiny random Llamas (fp32): token for token the
output of decoding without speculation whatever the draft (the target itself: every draft token
accepted; another random model: few), seeded sampled rows in the same steps, through chunked
prefill, preemption and the prefix cache; the draft engine's pages all returned; sampled rows'
distribution with a bad draft and with a draft that samples (chi-square, as
``test_speculative_sampling.py``); bad configs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jaxgen import LLM, SamplingParams
from jaxgen.config.engine_config import EngineConfig
from jaxgen.config.speculative_config import SpeculativeConfig
from jaxgen.engine.decoding.speculative.draft_model import check_vocabulary
from tests.engine.decoding.speculation_workload import repeating_prompts, speculation_knobs
from tests.family_models import save_tiny_model


@pytest.fixture(scope="module")
def knobs(tiny_loaded):
    return speculation_knobs(tiny_loaded.config)


@pytest.fixture(scope="module")
def prompts():
    return repeating_prompts()


@pytest.fixture(scope="module")
def params():
    """Greedy rows (one with a stop string, one shorter) and a seeded sampled one."""
    greedy = dict(temperature=0.0, max_tokens=64, ignore_eos=True)
    return [
        SamplingParams(**greedy),
        SamplingParams(**greedy | {"stop": ["zz"]}),
        SamplingParams(**greedy | {"max_tokens": 45}),
        SamplingParams(temperature=0.8, seed=3, max_tokens=50, ignore_eos=True),
    ]


@pytest.fixture(scope="module")
def expected(tiny_loaded, knobs, prompts, params):
    plain = LLM(tiny_loaded, **knobs)
    return plain.generate(prompts, params, use_tqdm=False), plain.stats()["steps"]


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory, smollm2_tokenizer) -> str:
    """Another random tiny Llama with the same vocabulary: a draft the target rarely agrees with."""
    return save_tiny_model(str(tmp_path_factory.mktemp("tiny-draft")), smollm2_tokenizer, seed=1)


def check_identical(llm, prompts, params, expected) -> dict:
    """``llm``'s outputs are ``expected``'s, token for token; every page is back in both
    engines' pools. Returns ``llm``'s stats."""
    got = llm.generate(prompts, params, use_tqdm=False)
    for want, have in zip(expected, got, strict=True):
        assert have.outputs[0].token_ids == want.outputs[0].token_ids
        assert have.outputs[0].text == want.outputs[0].text
        assert have.outputs[0].finish_reason == want.outputs[0].finish_reason
    assert llm.engine.scheduler.allocator.num_used_pages == 0
    draft_engine = llm.engine.speculator.proposer.engine
    assert draft_engine.scheduler.allocator.num_used_pages == 0
    assert not draft_engine.has_unfinished()
    return llm.stats()


@pytest.fixture(scope="module")
def self_draft(tiny_loaded, knobs):
    """The target as its own draft, given loaded."""
    config = {"method": "draft_model", "model": tiny_loaded, "num_speculative_tokens": 4}
    return LLM(tiny_loaded, **knobs, speculative_config=config)


def test_self_draft_accepts_everything(self_draft, prompts, params, expected):
    """Every greedy draft token is accepted, the output is the plain one, and accepted tokens
    save steps; the draft engine reuses its pages through the prefix cache."""
    llm = self_draft
    stats = check_identical(llm, prompts, params, expected[0])
    assert stats["spec_decode_method"] == "draft_model"
    assert stats["spec_decode_num_drafts"] > 0
    # The greedy rows' drafts are all accepted; the sampled row's where its draws agree.
    assert stats["spec_decode_acceptance_rate"] > 0.8
    assert stats["spec_decode_num_accepted_tokens_per_pos"][3] > 0
    assert stats["preemptions"] > 0
    assert stats["steps"] < 0.8 * expected[1]  # verify rows share a 16-token budget
    draft_stats = llm.engine.speculator.proposer.engine.stats()
    assert draft_stats["prefix_cache_hit_pages"] > 0


@pytest.fixture(scope="module")
def other_draft(tiny_loaded, knobs, other_model_dir):
    """Another random model as the draft, given as a path (``model`` without ``method``)."""
    config = {"model": other_model_dir, "num_speculative_tokens": 3}
    return LLM(tiny_loaded, **knobs, speculative_config=config)


def test_other_draft_output_identical(other_draft, prompts, params, expected):
    """A draft the target rarely agrees with: drafts are rejected mostly, back-off keeps them
    rare, the output is the plain one."""
    stats = check_identical(other_draft, prompts, params, expected[0])
    assert stats["spec_decode_method"] == "draft_model"
    assert stats["spec_decode_num_drafts"] > 0
    assert stats["spec_decode_acceptance_rate"] < 0.5


def test_no_compiles_after_precompile(self_draft, prompts):
    """``precompile`` compiles the draft engine's steps too: speculating compiles nothing."""
    self_draft.precompile()
    before = self_draft.stats()
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    self_draft.generate(prompts, greedy, use_tqdm=False)
    after = self_draft.stats()
    assert after["compiles"] == before["compiles"]
    assert after["spec_decode_num_drafts"] > before["spec_decode_num_drafts"]


def test_failing_draft_engine_stops_speculation(other_draft, prompts, params, expected):
    """A draft engine whose device fails stops proposing; the target decodes on, output
    unchanged."""
    proposer = other_draft.engine.speculator.proposer

    def fail(params, pool):  # the draft runner's after-step hook: its device fails
        raise RuntimeError("draft device lost")

    proposer.engine.runner.after_step = fail
    drafts = other_draft.stats()["spec_decode_num_drafts"]
    check_identical(other_draft, prompts, params, expected[0])
    assert proposer.failed
    assert other_draft.stats()["spec_decode_num_drafts"] == drafts


@pytest.mark.slow
def test_int8_self_draft_output_identical(
    tiny_loaded, tiny_model_dir, knobs, prompts, params, expected
):
    """The target's own checkpoint quantised to int8 at load as the draft (the int4 self-draft
    of a float target works the same way); its kernels compile anew."""
    config = {"model": tiny_model_dir, "quantization": "int8", "num_speculative_tokens": 4}
    llm = LLM(tiny_loaded, **knobs, speculative_config=config)
    stats = check_identical(llm, prompts, params, expected[0])
    assert llm.engine.speculator.proposer.engine.loaded.quantization == "int8"
    assert stats["spec_decode_acceptance_rate"] > 0.5


def test_draft_vocabulary_must_match(tiny_loaded, tmp_path, smollm2_tokenizer):
    small = save_tiny_model(str(tmp_path / "small"), smollm2_tokenizer, vocab_size=512)
    vocab = tiny_loaded.config.vocab_size
    with pytest.raises(ValueError, match=rf"speculative_config.model.*\(512\).*\({vocab}\)"):
        LLM(tiny_loaded, max_model_len=64, speculative_config={"model": small} | K2)

    class OtherTokenizer:
        def encode(self, text, add_special_tokens=True):
            return [len(text)]

    other = dataclasses.replace(tiny_loaded, tokenizer=OtherTokenizer())
    with pytest.raises(ValueError, match="speculative_config.model: the draft's tokenizer"):
        check_vocabulary(other, tiny_loaded)


K2 = {"num_speculative_tokens": 2}


@pytest.mark.parametrize(
    "config,name",
    [
        ({"method": "draft_model"} | K2, "speculative_config.model is required"),
        ({"model": "x", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"model": "x", "num_speculative_tokens": 17}, "num_speculative_tokens"),
        ({"model": "x", "prompt_lookup_max": 3} | K2, "prompt_lookup_max"),
        ({"model": "x", "quantization": "int3"} | K2, "speculative_config.quantization"),
        ({"method": "ngram", "quantization": "int4"} | K2, "speculative_config.quantization"),
        ({"method": "ngram", "model": "x"} | K2, "speculative_config.model"),
        ({"model": 3} | K2, "speculative_config.model"),
        ({"model": "x", "draft_tensor_parallel_size": 2} | K2, "draft_tensor_parallel_size"),
    ],
)
def test_bad_draft_config(config, name):
    with pytest.raises(ValueError, match=name):
        EngineConfig(speculative_config=config)


def test_draft_config(tiny_loaded):
    config = SpeculativeConfig.from_dict({"model": "some/dir"} | K2)
    assert (config.method, config.model, config.quantization) == ("draft_model", "some/dir", "auto")
    config = SpeculativeConfig.from_dict({"method": "draft_model", "model": tiny_loaded} | K2)
    assert config.model is tiny_loaded
    with pytest.raises(ValueError, match="speculative_config.quantization"):
        SpeculativeConfig.from_dict({"model": tiny_loaded, "quantization": "int8"} | K2)
    with pytest.raises(ValueError, match="speculative_config.model"):
        EngineConfig(speculative_config={"model": "x"} | K2, tensor_parallel_degree=2)


def test_server_setting(tiny_model_dir):
    """``--speculative-config`` JSON with a draft model reaches ``EngineConfig``; a bad one is
    refused naming the key."""
    from serving.settings.flags import check_engine_knobs
    from serving.settings.resolve import resolve_settings

    text = f'{{"model": "{tiny_model_dir}", "quantization": "int4", "num_speculative_tokens": 3}}'
    settings = resolve_settings({"speculative_config": text}, {})
    assert settings.engine["speculative_config"]["model"] == tiny_model_dir
    check_engine_knobs(settings)
    bad = resolve_settings(
        {
            "speculative_config": '{"model": "x", "prompt_lookup_min": 2, "num_speculative_tokens": 2}'
        },
        {},
    )
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        check_engine_knobs(bad)


# -- sampled rows: the target's distribution with a deliberately bad draft, and a sampling one ---
@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory, smollm2_tokenizer):
    """A tiny Llama with a 512-token vocabulary (its directory, loaded) and its processed
    distribution of tokens 1-3 (``test_speculative_sampling.target_probs``)."""
    from jaxgen.loaders import load_model
    from tests.engine.decoding.test_speculative_sampling import target_probs

    model_dir = save_tiny_model(
        str(tmp_path_factory.mktemp("tiny-llama-512")), smollm2_tokenizer, vocab_size=512
    )
    return model_dir, load_model(model_dir), target_probs(model_dir)


def with_head(target, transform):
    """``target`` with its LM head kernel [H, V] replaced by ``transform(kernel)`` (numpy)."""
    import jax

    def head(path, leaf):
        if "lm_head" not in jax.tree_util.keystr(path):
            return leaf
        return jax.numpy.asarray(transform(np.asarray(leaf, np.float32)))

    return dataclasses.replace(target, params=jax.tree_util.tree_map_with_path(head, target.params))


def sampled_draws(target, draft, num_draws: int):
    """The outputs of ``num_draws`` seeded requests of ``test_speculative_sampling``'s sampled
    workload (boosted top-k set, penalties) drafted by ``draft`` (k = 2), and the stats."""
    from tests.engine.decoding.test_speculative_sampling import SAMPLED_PROMPT, sampled

    config = {"model": draft, "num_speculative_tokens": 2}
    llm = LLM(
        target,
        max_model_len=64,
        max_rolling_batch_prefill_tokens=16,
        max_rolling_batch_size=4,
        page_size=16,
        speculative_config=config,
    )
    params = [sampled(seed) for seed in range(num_draws)]
    outputs = llm.generate([SAMPLED_PROMPT] * num_draws, params, use_tqdm=False)
    return outputs, llm.stats()


def check_distribution(outputs, probs) -> None:
    """Chi-square goodness of fit of tokens 2 and 3 (the drafted positions) against the
    target's distribution computed from HF transformers."""
    from tests.engine.decoding.test_speculative_sampling import P_VALUE, chi_square

    exact_both, both = {}, {}
    for a, p_a in probs[()].items():
        for b, p_b in probs[(a,)].items():
            for c, p_c in probs[(a, b)].items():
                exact_both[(b, c)] = exact_both.get((b, c), 0.0) + p_a * p_b * p_c
    for output in outputs:
        tokens = tuple(output.outputs[0].token_ids)
        both[tokens[1:3]] = both.get(tokens[1:3], 0) + 1
    assert chi_square(both, exact_both) > P_VALUE


@pytest.mark.slow  # ~20 s: 400 requests
def test_bad_draft_keeps_the_target_distribution(small_vocab):
    """A copy of the target whose LM head only scores tokens 505 (boosted: accepted with about
    a fifth of the mass) and 506 (outside top_k: always rejected), by the sign of one hidden
    unit: rejections are frequent, the output is the target's distribution."""
    from tests.engine.decoding.test_speculative_sampling import NUM_DRAWS

    _, target, probs = small_vocab

    def bad(kernel):
        kernel = np.zeros_like(kernel)
        kernel[0, 505], kernel[0, 506] = 100.0, -100.0
        return kernel

    outputs, stats = sampled_draws(target, with_head(target, bad), NUM_DRAWS)
    check_distribution(outputs, probs)
    assert stats["spec_decode_num_drafts"] > 50
    assert 0.02 < stats["spec_decode_acceptance_rate"] < 0.5  # rejections are frequent


@pytest.mark.slow  # ~20 s: 400 requests
def test_sampling_draft_keeps_the_target_distribution(small_vocab):
    """A draft whose LM head is the target's, flattened and perturbed: its sampled drafts
    spread over the top-k set (q not one-hot, unlike p), are accepted where its draw agrees
    with the target's on the same key, far more often than a greedy draft's; the output is
    the target's distribution, and for a seeded request the output without speculation."""
    from tests.engine.decoding.test_speculative_sampling import NUM_DRAWS, SAMPLED_PROMPT, sampled

    _, target, probs = small_vocab
    rng = np.random.default_rng(0)

    def perturbed(kernel):
        return 0.5 * kernel + 0.5 * kernel.std() * rng.normal(size=kernel.shape)

    outputs, stats = sampled_draws(target, with_head(target, perturbed), NUM_DRAWS)
    check_distribution(outputs, probs)
    drafted = stats["spec_decode_num_drafts"]
    assert drafted > 50
    assert 0.3 < stats["spec_decode_acceptance_rate"] < 0.95  # both accepted and rejected
    plain = LLM(target, max_model_len=64, max_rolling_batch_size=4, page_size=16)
    params = [sampled(seed) for seed in range(24)]
    expected = plain.generate([SAMPLED_PROMPT] * len(params), params, use_tqdm=False)
    for want, have in zip(expected, outputs, strict=False):
        assert have.outputs[0].token_ids == want.outputs[0].token_ids
