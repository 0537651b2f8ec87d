"""Two ways the engine hides its per-step host work, each against one step at a time:
asynchronous scheduling (``async_scheduling``: the next step is dispatched before this one's
tokens are read; its decode rows take them on the device) and multi-step decoding
(``num_scheduler_steps``: one call runs several decode steps on the device, each fed the last
one's tokens). Outputs must be those of one step at a time: greedy and seeded, with natural
stops, stop strings, length limits, preemption, prefix reuse, and the requests that make them
fall back (penalties, min_tokens); nothing compiles after precompile."""

from __future__ import annotations

import numpy as np
import pytest

from jaxgen import LLM, SamplingParams

# mode: (engine knobs, the stats counter of the steps it ran its own way)
MODES = {
    "async": ({"async_scheduling": True}, "async_steps"),
    "multi-step": ({"num_scheduler_steps": 4}, "multi_step_calls"),
}


def _prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 1000, int(n)).tolist() for n in rng.integers(3, 40, count)]


def _both(loaded, mode, prompts, params, **knobs):
    """Outputs of the same requests one step at a time and in ``mode``, and the number of
    steps ``mode`` ran its own way, with the ``mode`` engine's stats."""
    knobs.setdefault("max_model_len", 128)
    single = LLM(loaded, **knobs).generate(prompts, params, use_tqdm=False)
    mode_knobs, counter = MODES[mode]
    llm = LLM(loaded, **mode_knobs, **knobs)
    outs = llm.generate(prompts, params, use_tqdm=False)
    stats = llm.stats()
    return single, outs, stats[counter], stats


def _same(single, outs):
    for a, b in zip(single, outs, strict=True):
        for x, y in zip(a.outputs, b.outputs, strict=True):
            assert (x.token_ids, x.text, x.finish_reason) == (y.token_ids, y.text, y.finish_reason)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batching", ["paged", "continuous"])
def test_greedy_outputs_match_one_step_at_a_time(tiny_loaded, mode, batching):
    prompts = _prompts(6)
    params = [SamplingParams(max_tokens=m, temperature=0.0) for m in (1, 2, 5, 17, 30, 9)]
    single, outs, own_way, stats = _both(tiny_loaded, mode, prompts, params, batching=batching)
    _same(single, outs)
    assert own_way > 0
    assert stats["kv_pages_used"] == 0 and stats["num_running"] == 0


def test_multi_step_with_flags_the_host_read_matches(tiny_loaded):
    """As on a GPU, where the sampler's flags come from the batch the host read
    (``host_flags``; no run-time conditional): the multi-step decode loop samples a plain
    batch of greedy and seeded rows as one step at a time does."""
    prompts = _prompts(4, seed=2)
    params = [SamplingParams(max_tokens=9, temperature=0.8 * (i % 2), seed=i) for i in range(4)]
    single = LLM(tiny_loaded, max_model_len=128).generate(prompts, params, use_tqdm=False)
    llm = LLM(
        tiny_loaded, max_model_len=128, num_scheduler_steps=4, sampler_executables="per-batch"
    )
    _same(single, llm.generate(prompts, params, use_tqdm=False))
    assert llm.stats()["multi_step_calls"] > 0


@pytest.mark.parametrize("mode", MODES)
def test_seeded_sampling_logprobs_and_stop_strings_match(tiny_loaded, mode):
    prompts = _prompts(5, seed=1)
    single_text = (
        LLM(tiny_loaded, max_model_len=128)
        .generate(prompts[:1], SamplingParams(max_tokens=12, temperature=0.0), use_tqdm=False)[0]
        .outputs[0]
        .text
    )
    stop = single_text[len(single_text) // 2 :][:3] or None  # a stop string met mid-output
    params = [
        SamplingParams(max_tokens=24, temperature=0.9, top_p=0.9, seed=7 + i, logprobs=2)
        for i in range(4)
    ] + [SamplingParams(max_tokens=12, temperature=0.0, stop=[stop] if stop else None)]
    single, outs, own_way, _ = _both(tiny_loaded, mode, prompts, params)
    _same(single, outs)
    for a, b in zip(single[:4], outs[:4], strict=True):  # the rows that asked for logprobs
        for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True):
            assert x.keys() == y.keys()
            np.testing.assert_allclose(list(x.values()), list(y.values()), atol=1e-5)
    assert own_way > 0


@pytest.mark.parametrize("mode", MODES)
def test_preemption_and_prefix_reuse_match(tiny_loaded, mode):
    prompts = [list(range(40, 72)) + p for p in _prompts(5, seed=2)]  # a shared 2-page prefix
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    page_bytes = tiny_loaded.config.kv_bytes_per_token(4) * 16
    single, outs, own_way, stats = _both(
        tiny_loaded, mode, prompts, params, kv_cache_memory=9 * page_bytes
    )
    _same(single, outs)
    assert stats["preemptions"] > 0 and stats["prefix_cache_hit_pages"] > 0
    assert own_way > 0 and stats["kv_pages_used"] == 0


@pytest.mark.parametrize("mode", MODES)
def test_penalties_fall_back_to_one_step_at_a_time(tiny_loaded, mode):
    prompts = _prompts(3, seed=3)
    params = [
        SamplingParams(max_tokens=16, temperature=0.0, repetition_penalty=1.3),
        SamplingParams(max_tokens=16, temperature=0.0),
        SamplingParams(max_tokens=16, temperature=0.0, frequency_penalty=0.5, min_tokens=16),
    ]
    single, outs, own_way, _ = _both(tiny_loaded, mode, prompts, params)
    _same(single, outs)
    assert own_way == 0  # a penalised sequence was running the whole time


@pytest.mark.parametrize("mode", MODES)
def test_no_compiles_after_precompile(tiny_loaded, mode):
    llm = LLM(tiny_loaded, max_model_len=128, precompile=True, **MODES[mode][0])
    before = llm.stats()["compiles"]
    prompts = _prompts(6, seed=4)
    llm.generate(prompts, SamplingParams(max_tokens=20, temperature=0.0), use_tqdm=False)
    stats = llm.stats()
    assert stats["compiles"] == before and stats[MODES[mode][1]] > 0


@pytest.mark.parametrize(
    "knobs",
    [
        {"async_scheduling": "yes"},
        {"num_scheduler_steps": 0},
        {"num_scheduler_steps": "4"},
        {"num_scheduler_steps": 4, "async_scheduling": True},
    ],
    ids=str,
)
def test_bad_values_are_clear_errors(tiny_loaded, knobs):
    name = "num_scheduler_steps" if "num_scheduler_steps" in knobs else "async_scheduling"
    with pytest.raises(ValueError, match=name):
        LLM(tiny_loaded, **knobs)


def test_multi_step_widths_cover_the_steps_ahead(tiny_loaded):
    """The reference backend gathers a block-table width bucket chosen per call: it must cover
    the tokens of every step of the call (sequences cross page boundaries inside it)."""
    prompts = _prompts(3, seed=8)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    knobs = dict(attention_backend="reference", page_size=4)
    single, outs, own_way, _ = _both(tiny_loaded, "multi-step", prompts, params, **knobs)
    _same(single, outs)
    assert own_way > 0


def test_a_failed_step_with_a_step_in_flight_recovers(tiny_loaded):
    from jaxgen.engine.errors import StepFailed
    from tests.engine.test_engine_recovery import inject_fault

    llm = LLM(tiny_loaded, max_model_len=128, async_scheduling=True)
    engine = llm.engine
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(_prompts(3, seed=5)):
        engine.add_request(f"r{i}", None, prompt, params)
    while engine.async_steps < 3:
        engine.step()
    assert engine.in_flight is not None
    restore = inject_fault(engine.runner, times=1)
    try:
        with pytest.raises(StepFailed) as failed:
            while True:
                engine.step()
    finally:
        restore()
    assert sorted(failed.value.request_ids) == ["r0", "r1", "r2"]
    assert engine.in_flight is None and engine.dead is None
    prompts = _prompts(4, seed=6)
    reference = LLM(tiny_loaded, max_model_len=128).generate(prompts, params, use_tqdm=False)
    _same(reference, llm.generate(prompts, params, use_tqdm=False))
    assert llm.stats()["kv_pages_used"] == 0 and llm.stats()["failed_steps"] == 1


def test_abort_with_a_step_in_flight(tiny_loaded):
    """A request aborted while the step holding it is in flight (its prompt logprobs too) ends
    there; the others finish as they would stepping one at a time, and every page comes back."""
    prompts = _prompts(3, seed=7)
    params = [
        SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, prompt_logprobs=2),
        SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=25, temperature=0.0, ignore_eos=True),
    ]
    reference = LLM(tiny_loaded, max_model_len=128).generate(prompts, params, use_tqdm=False)
    llm = LLM(tiny_loaded, max_model_len=128, async_scheduling=True)
    engine = llm.engine
    for i in (1, 2):
        engine.add_request(f"r{i}", None, prompts[i], params[i])
    engine.step()  # r1 and r2's prefill read, their first decode in flight
    engine.add_request("r0", None, prompts[0], params[0])
    engine.step()  # r0's prefill (with its prompt logprobs) dispatched, the decode read
    assert engine.requests["r0"].seqs[0] in engine.in_flight.batch.seqs
    aborted = engine.abort("r0")
    assert aborted.finished and aborted.outputs[0].finish_reason == "abort"
    finished = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    assert sorted(finished) == ["r1", "r2"]
    for i in (1, 2):
        assert finished[f"r{i}"].outputs[0].token_ids == reference[i].outputs[0].token_ids
    assert llm.stats()["kv_pages_used"] == 0 and llm.stats()["num_running"] == 0
