"""``scheduling_policy="priority"`` through the Python API on the tiny model: ``LLM.generate``'s
``priority`` list gives the same greedy outputs as one prompt at a time; a high-priority request
added while low ones run preempts one of them (recomputed later, its output unchanged) and
finishes first (plain, asynchronous and speculative steps); beam search runs under the policy;
a bad ``priority`` refuses the whole call with nothing queued; under ``fcfs`` a non-zero
priority is refused."""

from __future__ import annotations

import pytest

from jaxgen import LLM, BeamSearchParams, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "The quick brown fox",
    "In 1492, Columbus",
    "Water boils at",
]
# Drafts whenever the last token was seen before: random tiny models repeat themselves.
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 2,
    "prompt_lookup_min": 1,
    "prompt_lookup_max": 2,
}
KNOBS = dict(max_model_len=128, kv_cache_memory=4 << 20, max_rolling_batch_size=2)


@pytest.fixture(scope="module")
def llm(tiny_loaded):
    return LLM(tiny_loaded, scheduling_policy="priority", **KNOBS)


@pytest.fixture(scope="module")
def fcfs(tiny_loaded):
    return LLM(tiny_loaded, **KNOBS)


@pytest.fixture(scope="module")
def alone(llm):
    """Each prompt's greedy tokens, generated on its own."""
    return {p: llm.generate(p, GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in PROMPTS}


def test_priority_list_gives_the_outputs_of_one_prompt_at_a_time(llm, alone):
    outs = llm.generate(PROMPTS, GREEDY, priority=[3, 0, 2, 0, 1, 5], use_tqdm=False)
    assert [out.prompt for out in outs] == PROMPTS, "outputs in the prompts' order"
    assert [out.outputs[0].token_ids for out in outs] == [alone[p] for p in PROMPTS]
    one_for_all = llm.generate(PROMPTS[:2], GREEDY, priority=-1, use_tqdm=False)
    assert [out.outputs[0].token_ids for out in one_for_all] == [alone[p] for p in PROMPTS[:2]]


def preempt_for_a_high_priority_request(llm) -> list[str]:
    """Two low-priority requests fill both slots; a high-priority one arrives. Returns the
    order the requests finished in, after checking every output against ``alone``'s."""
    engine = llm.engine
    long = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    tokenizer = llm.get_tokenizer()
    for name, prompt in (("low-0", PROMPTS[0]), ("low-1", PROMPTS[1])):
        engine.add_request(name, prompt, tokenizer.encode(prompt), long, priority=5)
    for _ in range(4):
        engine.step()
    preemptions = engine.stats()["preemptions"]
    engine.add_request("high", PROMPTS[2], tokenizer.encode(PROMPTS[2]), GREEDY, priority=0)
    finished, outputs = [], {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finished.append(out.request_id)
                outputs[out.request_id] = out.outputs[0].token_ids
    assert engine.stats()["preemptions"] > preemptions, "a low-priority request gave its slot"
    expected = {
        name: llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
        for name, prompt, params in (
            ("low-0", PROMPTS[0], long),
            ("low-1", PROMPTS[1], long),
            ("high", PROMPTS[2], GREEDY),
        )
    }
    assert outputs == expected, "a preempted request recomputes to the same greedy output"
    return finished


def test_a_high_priority_request_preempts_a_running_low_one_and_finishes_first(llm):
    assert preempt_for_a_high_priority_request(llm)[0] == "high"


@pytest.mark.parametrize(
    "mode",
    [{"async_scheduling": True}, {"speculative_config": NGRAM}],
    ids=["async", "speculative"],
)
def test_preemption_for_priority_with_other_step_modes(tiny_loaded, mode):
    llm = LLM(tiny_loaded, scheduling_policy="priority", **mode, **KNOBS)
    assert preempt_for_a_high_priority_request(llm)[0] == "high"


def test_beam_search_runs_under_the_priority_policy(llm, fcfs):
    params = BeamSearchParams(beam_width=2, max_tokens=6)
    ours = llm.beam_search([PROMPTS[0]], params)[0].sequences
    theirs = fcfs.beam_search([PROMPTS[0]], params)[0].sequences
    assert [s.tokens for s in ours] == [s.tokens for s in theirs]


@pytest.mark.parametrize(
    ("priority", "message"),
    [
        ([0, True, 0], "priority must be an int, got True"),
        ([0, 1.5, 0], "priority must be an int, got 1.5"),
        ("1", "priority must be an int"),
        ([0, 1], "priority: 2 given for 3 prompts"),
    ],
)
def test_a_bad_priority_refuses_the_whole_call(llm, priority, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(PROMPTS[:3], GREEDY, priority=priority, use_tqdm=False)
    assert not llm.engine.has_unfinished()
    assert llm.engine.stats()["num_waiting"] == 0


def test_fcfs_refuses_a_non_zero_priority(fcfs):
    with pytest.raises(ValueError, match="priority 1 needs scheduling_policy='priority'"):
        fcfs.generate(PROMPTS[:2], GREEDY, priority=[0, 1], use_tqdm=False)
    assert not fcfs.engine.has_unfinished()
    with pytest.raises(ValueError, match="^priority -1 needs"):
        fcfs.engine.add_request("r", None, [1, 2, 3], GREEDY, priority=-1)
    outs = fcfs.generate(PROMPTS[:2], GREEDY, priority=[0, 0], use_tqdm=False)
    assert all(len(out.outputs[0].token_ids) == 12 for out in outs)


def test_unknown_scheduling_policy_is_refused(tiny_loaded):
    with pytest.raises(ValueError, match="scheduling_policy must be one of"):
        LLM(tiny_loaded, scheduling_policy="lifo")
