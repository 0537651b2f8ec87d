"""Prompt logprobs, logit_bias and ``max_tokens=None`` in the engine (tiny random Llama, fp32):
prompt logprobs equal transformers' log-softmax whatever the chunking or prefix cache, and
compile nothing new after warm-up."""

from __future__ import annotations

import numpy as np
import pytest

from jaxgen import LLM, SamplingParams

TEXT = (
    "The quick brown fox jumps over the lazy dog, and then it runs away into the forest "
    "where the trees are tall and the rivers run deep and cold all year."
)
SMALL = dict(max_model_len=128, max_rolling_batch_prefill_tokens=64, max_rolling_batch_size=8)


@pytest.fixture(scope="module")
def llm(tiny_loaded):
    """One engine shared by the tests that do not need their own knobs."""
    return LLM(tiny_loaded, **SMALL)


@pytest.fixture(scope="module")
def prompt(smollm2_tokenizer):
    return smollm2_tokenizer.encode(TEXT, add_special_tokens=True)


@pytest.fixture(scope="module")
def reference(tiny_model_dir, prompt):
    """transformers fp32: [L - 1, V] log-softmax of the logits before each prompt token."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model.eval()(torch.tensor([prompt])).logits[0, :-1]
    return torch.log_softmax(logits.float(), dim=-1).numpy()


def check_against_reference(prompt_logprobs, prompt, reference, k):
    assert len(prompt_logprobs) == len(prompt) and prompt_logprobs[0] is None
    for position in range(1, len(prompt)):
        entry = prompt_logprobs[position]
        row = reference[position - 1]
        token = prompt[position]
        assert next(iter(entry)) == token  # the prompt token's own logprob comes first
        assert abs(entry[token] - row[token]) < 1e-4
        top = np.argsort(-row)[:k]
        for top_token in top:
            assert abs(entry[int(top_token)] - row[top_token]) < 1e-4
        assert len(entry) in (k, k + 1)


@pytest.mark.parametrize("chunked", [False, True])
def test_prompt_logprobs_match_transformers(llm, tiny_loaded, prompt, reference, chunked):
    if chunked:  # a budget of 16 tokens: the 33-token prompt straddles 3 chunks
        knobs = dict(SMALL, max_rolling_batch_prefill_tokens=16, max_rolling_batch_size=4)
        llm = LLM(tiny_loaded, **knobs)
    params = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=3)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    check_against_reference(out.prompt_logprobs, prompt, reference, 3)
    plain = llm.generate([prompt], SamplingParams(max_tokens=2, temperature=0.0), use_tqdm=False)
    assert out.token_ids == plain[0].token_ids and plain[0].prompt_logprobs is None


def test_prompt_logprobs_skip_the_prefix_cache(llm, prompt, reference):
    llm.generate([prompt], SamplingParams(max_tokens=1), use_tqdm=False)  # fills the cache
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, n=2)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    check_against_reference(out.prompt_logprobs, prompt, reference, 0)
    assert llm.stats()["prefix_cache_hit_pages"] > 0  # the second sample still shares pages


def test_no_compiles_after_warmup_with_prompt_logprobs(llm, prompt):
    greedy = SamplingParams(temperature=0.0, max_tokens=4)
    asking = SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=1)
    llm.precompile([greedy, asking])
    before = llm.stats()["compiles"]
    prompts = [prompt, prompt[:20], prompt[5:], prompt[:3] * 30]
    outs = llm.generate(prompts, [asking, greedy, asking, greedy], use_tqdm=False)
    assert llm.stats()["compiles"] == before
    assert outs[0].prompt_logprobs[1] and outs[1].prompt_logprobs is None
    assert len(outs[2].prompt_logprobs) == len(prompt) - 5


def test_logit_bias_forces_and_forbids(llm):
    prompt = [1, 2, 3, 4]
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    base = llm.generate([prompt], greedy, use_tqdm=False)[0].token_ids
    forced = SamplingParams(max_tokens=6, temperature=0.0, logit_bias={777: 100})
    assert llm.generate([prompt], forced, use_tqdm=False)[0].token_ids == [777] * 6
    forbid = SamplingParams(
        max_tokens=6, temperature=0.0, logit_bias={token: -100 for token in set(base)}
    )
    assert not set(llm.generate([prompt], forbid, use_tqdm=False)[0].token_ids) & set(base)
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate([prompt], SamplingParams(logit_bias={10**7: 1.0}), use_tqdm=False)


@pytest.mark.parametrize(
    "bias", [{"3": 1.0}, {3: 101.0}, {-1: 1.0}, {3: float("nan")}, {True: 1.0}, [3]]
)
def test_logit_bias_is_checked(bias):
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=bias)


@pytest.mark.parametrize("value", [-1, 21, 1.5, True])
def test_prompt_logprobs_is_checked(value):
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=value)


def test_max_tokens_none_fills_the_context(llm):
    params = SamplingParams(max_tokens=None, temperature=0.0, ignore_eos=True)
    out = llm.generate([[1, 2, 3, 4, 5]], params, use_tqdm=False)[0]
    assert len(out.token_ids) == SMALL["max_model_len"] - 5 and out.finish_reason == "length"


@pytest.mark.slow
def test_prompt_logprobs_survive_preemption(tiny_loaded):
    """8 usable pages and long outputs: sequences are preempted and recomputed, and each
    request's prompt logprobs are still those of a run on its own."""
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 1000, int(n)).tolist() for n in (20, 25, 30, 18, 22)]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, prompt_logprobs=1)
    alone = LLM(tiny_loaded, batching="none", max_model_len=128).generate(
        prompts, params, use_tqdm=False
    )
    page_bytes = tiny_loaded.config.kv_bytes_per_token(4) * 16
    llm = LLM(tiny_loaded, max_model_len=128, kv_cache_memory=8 * page_bytes)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.stats()["preemptions"] > 0
    for out, reference in zip(outs, alone, strict=True):
        assert out.token_ids == reference.token_ids
        assert out.prompt_logprobs[0] is None and reference.prompt_logprobs[0] is None
        for got, want in zip(out.prompt_logprobs[1:], reference.prompt_logprobs[1:], strict=True):
            assert got.keys() == want.keys()
            assert all(abs(got[t] - want[t]) < 1e-5 for t in got)


def test_gpu_host_decisions_give_the_same_tokens(tiny_loaded, llm, prompt, reference):
    """``sampler_executables="per-batch"``, as on a GPU (where XLA would run some conditionals
    on the host, waiting for the device): a step no row of which wants prompt logprobs is
    traced without that branch, and the sampler's flags come from the batch (``host_flags``: no conditional for a plain greedy
    batch); prompt logprobs, greedy and seeded sampled tokens, logprobs, penalties and logit
    bias are the same as with the one shared executable of each."""
    gpu_like = LLM(tiny_loaded, sampler_executables="per-batch", **SMALL)
    runner = gpu_like.engine.runner
    assert runner.per_batch_executables
    used = []
    shared_sampler = runner._sample

    def recording_sampler(logits, sampling, flags):
        used.append(flags)
        return shared_sampler(logits, sampling, flags=flags)

    runner._sample = recording_sampler
    params = SamplingParams(max_tokens=3, temperature=0.0, prompt_logprobs=2)
    out = gpu_like.generate([prompt], params, use_tqdm=False)[0]
    check_against_reference(out.prompt_logprobs, prompt, reference, 2)
    greedy = SamplingParams(max_tokens=5, temperature=0.0)
    batches = {
        "plain greedy": [greedy] * 2,
        "plain mixed": [greedy, SamplingParams(max_tokens=5, seed=3, top_p=0.9)],
        "logprobs": [SamplingParams(max_tokens=5, temperature=0.0, logprobs=3)] * 2,
        "penalties and bias": [
            SamplingParams(max_tokens=5, seed=4, repetition_penalty=1.3),
            SamplingParams(max_tokens=5, temperature=0.0, logit_bias={7: 5.0}),
        ],
    }
    expected_flags = {
        "plain greedy": {(True, False)},
        "plain mixed": {(False, False)},
        "logprobs": {(True, True)},
        "penalties and bias": {(False, True)},
    }
    prompts = [prompt, prompt[:11]]
    for name, params in batches.items():
        used.clear()
        expected = llm.generate(prompts, params, use_tqdm=False)
        actual = gpu_like.generate(prompts, params, use_tqdm=False)
        assert [o.token_ids for o in actual] == [o.token_ids for o in expected], name
        for got, want in zip(actual, expected, strict=True):
            assert (got.logprobs is None) == (want.logprobs is None)
            for got_step, want_step in zip(got.logprobs or [], want.logprobs or [], strict=True):
                assert got_step.keys() == want_step.keys()
                assert all(abs(got_step[t] - want_step[t]) < 1e-5 for t in got_step)
        assert {(flags.all_greedy, flags.masks) for flags in used} == expected_flags[name], name
        if name == "plain greedy":
            expected_plain = expected
    assert out.token_ids == expected_plain[0].token_ids[:3]
