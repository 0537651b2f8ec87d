"""Step observers: every engine mode (plain, multi-step, asynchronous step-ahead, speculative
verify, beam search) tells each step that ran, once, through ``LLMEngine.record_step``; the
events add up to the engine's own counters; compiles show on cold steps only; an observer that
raises breaks nothing; unsubscribing stops the events."""

from __future__ import annotations

import pytest

from jaxgen import LLM, BeamSearchParams, SamplingParams
from jaxgen.engine.step_observers import StepObservers
from tests.engine.decoding.speculation_workload import repeating_prompts, speculation_knobs

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
MODES = {
    "plain": ({}, {"plain"}),
    "multi-step": ({"num_scheduler_steps": 4}, {"plain"}),
    "step-ahead": ({"async_scheduling": True}, {"ahead"}),
    "speculative": ({"speculative_config": NGRAM}, {"verify"}),
}


@pytest.fixture(scope="module")
def knobs(tiny_loaded):
    return speculation_knobs(tiny_loaded.config)


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_tells_each_step_once(tiny_loaded, knobs, mode):
    extra, modes = MODES[mode]
    llm = LLM(tiny_loaded, **knobs, **extra)
    engine = llm.engine
    events = []
    unsubscribe = engine.observers.add(events.append)
    before = engine.stats()
    llm.generate(repeating_prompts()[:3], GREEDY, use_tqdm=False)
    after = engine.stats()
    assert sum(e.num_steps for e in events) == after["steps"] - before["steps"]
    assert {e.mode for e in events} == modes
    assert all(1 <= e.batch_size <= 3 and e.seconds >= 0 for e in events)
    assert sum(e.compiles for e in events) <= after["compiles"] - before["compiles"]
    if mode == "multi-step":
        assert any(e.num_steps == 4 for e in events)
    unsubscribe()
    count = len(events)
    llm.generate(repeating_prompts()[:1], GREEDY, use_tqdm=False)
    assert len(events) == count  # unsubscribed: no more events


def test_warm_steps_compile_nothing_and_a_failing_observer_breaks_nothing(tiny_loaded, knobs):
    llm = LLM(tiny_loaded, **knobs)
    prompts = repeating_prompts()[:2]
    first = llm.generate(prompts, GREEDY, use_tqdm=False)
    events = []
    llm.engine.observers.add(events.append)

    def broken(event):
        raise RuntimeError("observer bug")

    llm.engine.observers.add(broken)
    again = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in first]
    assert events and all(e.compiles == 0 for e in events)  # warm: the same executables


def test_beam_search_steps_are_told(tiny_loaded, knobs):
    llm = LLM(tiny_loaded, **knobs)
    events = []
    llm.engine.observers.add(events.append)
    steps = llm.engine.num_steps
    llm.beam_search(
        [{"prompt": "The capital of France is"}], BeamSearchParams(beam_width=2, max_tokens=3)
    )
    assert events and {e.mode for e in events} == {"beam"}
    assert sum(e.num_steps for e in events) == llm.engine.num_steps - steps


def test_observers_unsubscribe_themselves_while_told():
    observers = StepObservers()
    told = []
    unsubscribe = None

    def once(event):
        told.append(event)
        unsubscribe()

    unsubscribe = observers.add(once)
    observers.add(told.append)
    observers.emit("first")
    observers.emit("second")
    assert told == ["first", "first", "second"] and len(observers) == 1
