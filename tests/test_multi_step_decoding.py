"""Multi-step decoding (``num_scheduler_steps`` > 1): when every running sequence decodes, one
call runs that many decode steps on the device, each fed the last one's tokens, and the host
reads them at once. Outputs must be those of one step at a time: greedy and seeded, with
natural stops, stop strings, length limits, preemption, prefix reuse, and the requests that
make it fall back (penalties, min_tokens); nothing compiles after precompile."""

from __future__ import annotations

import numpy as np
import pytest

from jaxgen import LLM, SamplingParams

STEPS = 4


@pytest.fixture(scope="module")
def tiny_loaded(tiny_model_dir):
    from jaxgen.loaders import load_model

    return load_model(tiny_model_dir)


def _prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 1000, int(n)).tolist() for n in rng.integers(3, 40, count)]


def _both(loaded, prompts, params, **knobs):
    """Outputs of the same requests one step at a time and multi-step, and the multi-step
    engine's stats."""
    knobs.setdefault("max_model_len", 128)
    single = LLM(loaded, **knobs).generate(prompts, params, use_tqdm=False)
    llm = LLM(loaded, num_scheduler_steps=STEPS, **knobs)
    outs = llm.generate(prompts, params, use_tqdm=False)
    return single, outs, llm.stats()


def _same(single, outs):
    for a, b in zip(single, outs, strict=True):
        for x, y in zip(a.outputs, b.outputs, strict=True):
            assert (x.token_ids, x.text, x.finish_reason) == (y.token_ids, y.text, y.finish_reason)


@pytest.mark.parametrize("batching", ["paged", "continuous"])
def test_greedy_outputs_match_one_step_at_a_time(tiny_loaded, batching):
    prompts = _prompts(6)
    params = [SamplingParams(max_tokens=m, temperature=0.0) for m in (1, 2, 5, 17, 30, 9)]
    single, outs, stats = _both(tiny_loaded, prompts, params, batching=batching)
    _same(single, outs)
    assert stats["multi_step_calls"] > 0
    assert stats["kv_pages_used"] == 0 and stats["num_running"] == 0


def test_reference_backend_widths_cover_the_steps_ahead(tiny_loaded):
    """The reference backend gathers a block-table width bucket chosen per call: it must cover
    the tokens of every step of the call (sequences cross page boundaries inside it)."""
    prompts = _prompts(3, seed=8)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    single, outs, stats = _both(
        tiny_loaded, prompts, params, attention_backend="reference", page_size=4
    )
    _same(single, outs)
    assert stats["multi_step_calls"] > 0


def test_seeded_sampling_logprobs_and_stop_strings_match(tiny_loaded):
    prompts = _prompts(5, seed=1)
    single_text = (
        LLM(tiny_loaded, max_model_len=128)
        .generate(prompts[:1], SamplingParams(max_tokens=12, temperature=0.0), use_tqdm=False)[0]
        .outputs[0]
        .text
    )
    stop = single_text[len(single_text) // 2 :][:3] or None  # a stop string met mid-call
    params = [
        SamplingParams(max_tokens=24, temperature=0.9, top_p=0.9, seed=7 + i, logprobs=2)
        for i in range(4)
    ] + [SamplingParams(max_tokens=12, temperature=0.0, stop=[stop] if stop else None)]
    single, outs, stats = _both(tiny_loaded, prompts, params)
    _same(single, outs)
    for a, b in zip(single[:4], outs[:4], strict=True):  # the rows that asked for logprobs
        for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True):
            assert x.keys() == y.keys()
            np.testing.assert_allclose(list(x.values()), list(y.values()), atol=1e-5)
    assert stats["multi_step_calls"] > 0


def test_preemption_and_prefix_reuse_match(tiny_loaded):
    prompts = [list(range(40, 72)) + p for p in _prompts(5, seed=2)]  # a shared 2-page prefix
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    page_bytes = tiny_loaded.config.kv_bytes_per_token(4) * 16
    single, outs, stats = _both(tiny_loaded, prompts, params, kv_cache_memory=9 * page_bytes)
    _same(single, outs)
    assert stats["preemptions"] > 0 and stats["prefix_cache_hit_pages"] > 0
    assert stats["multi_step_calls"] > 0 and stats["kv_pages_used"] == 0


def test_penalties_and_min_tokens_fall_back_to_one_step_at_a_time(tiny_loaded):
    prompts = _prompts(3, seed=3)
    params = [
        SamplingParams(max_tokens=16, temperature=0.0, repetition_penalty=1.3),
        SamplingParams(max_tokens=16, temperature=0.0),
        SamplingParams(max_tokens=16, temperature=0.0, min_tokens=16),
    ]
    single, outs, stats = _both(tiny_loaded, prompts, params)
    _same(single, outs)
    assert stats["multi_step_calls"] == 0  # a penalised sequence was running the whole time


def test_no_compiles_after_precompile(tiny_loaded):
    llm = LLM(tiny_loaded, max_model_len=128, num_scheduler_steps=STEPS, precompile=True)
    before = llm.stats()["compiles"]
    prompts = _prompts(6, seed=4)
    llm.generate(prompts, SamplingParams(max_tokens=20, temperature=0.0), use_tqdm=False)
    stats = llm.stats()
    assert stats["compiles"] == before and stats["multi_step_calls"] > 0


@pytest.mark.parametrize(
    "knobs",
    [
        {"num_scheduler_steps": 0},
        {"num_scheduler_steps": "4"},
        {"num_scheduler_steps": 4, "async_scheduling": True},
    ],
)
def test_bad_num_scheduler_steps(tiny_loaded, knobs):
    with pytest.raises(ValueError, match="num_scheduler_steps"):
        LLM(tiny_loaded, **knobs)
