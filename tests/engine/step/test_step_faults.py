"""Every way out of a step leaves each of its requests finished, or failed and freed (issue
64): a fault at each point a step can fail (building its batch, the device computation, the
read, post-processing) and a cancellation mid-stream, under each engine mode (synchronous,
asynchronous scheduling, multi-step, speculative, speculative with asynchronous scheduling),
through ``LLM.generate`` and ``AsyncLLM``, injected through the engine's and the runner's
hooks (``fault_plan``).
After each: every client has its answer or an error (none hangs), nothing runs or waits, no
page is used and the free list is whole, and a fresh run gives the greedy tokens of before.
One engine per mode serves every point: it must survive each fault."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from jaxgen import LLM
from jaxgen.async_llm import AsyncLLM
from jaxgen.engine.errors import StepFailed
from tests.engine.step.fault_plan import (
    GREEDY,
    MODES,
    POINTS,
    PROMPTS,
    FaultPlan,
    InjectedFault,
    assert_idle,
    knobs,
    wait_idle,
)

pytestmark = pytest.mark.timeout(300)
LATE = 2  # AsyncLLM: clients that arrive once the fault came (4 run at a time)


@pytest.fixture(scope="module")
def engines(tiny_loaded):
    """mode -> (its ``LLM``, the greedy tokens of ``PROMPTS`` before any fault), built once."""
    built = {}

    def get(mode: str):
        if mode not in built:
            llm = LLM(tiny_loaded, **knobs(tiny_loaded.config), **MODES[mode])
            built[mode] = (llm, tokens_of(llm.generate(PROMPTS, GREEDY, use_tqdm=False)))
        return built[mode]

    return get


def tokens_of(outputs) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in outputs]


def test_the_modes_agree_and_run_their_own_steps(engines):
    reference = engines("sync")[1]
    for mode in MODES:
        assert engines(mode)[1] == reference, mode
    stats = {mode: engines(mode)[0].stats() for mode in MODES}
    assert stats["ahead"]["async_steps"] > 0 and stats["multi-step"]["multi_step_calls"] > 0
    assert stats["speculative"]["spec_decode_num_drafts"] > 0
    spec_ahead = stats["speculative-ahead"]
    assert spec_ahead["spec_decode_num_drafts"] > 0 and spec_ahead["async_steps"] > 0


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("mode", MODES)
def test_llm_generate(engines, mode, point):
    """``LLM.generate`` is all or nothing: a failed step raises ``StepFailed`` (its requests
    failed, the others aborted); a cancel (Ctrl-C mid-step) raises as it came, the requests
    aborted. A request aborted at the engine mid-stream ends there, the others go on."""
    llm, reference = engines(mode)
    engine = llm.engine
    if point == "cancel":
        with FaultPlan(engine, mode, "postprocess", KeyboardInterrupt) as plan:
            with pytest.raises(KeyboardInterrupt):
                llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        outcome = "all aborted"
        assert_idle(engine)
        outcome += "; engine abort: " + _abort_mid_stream(engine, mode, reference)
    else:
        with FaultPlan(engine, mode, point) as plan:
            with pytest.raises(StepFailed) as failed:
                llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        assert isinstance(failed.value.error, InjectedFault) and failed.value.request_ids
        outcome = f"{len(failed.value.request_ids)} failed, the rest aborted"
    assert plan.fired == 1
    stats = assert_idle(engine)
    assert tokens_of(llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == reference
    assert_idle(engine)
    _report("LLM", mode, point, outcome, stats)


def _abort_mid_stream(engine, mode: str, reference) -> str:
    """Two of four requests aborted once the mode's steps run; the others end as before."""
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"abort-{i}", None, prompt, GREEDY)
    plan = FaultPlan(engine, mode, None)
    while not plan.armed():
        assert engine.has_unfinished(), "the requests ended before the mode's steps ran"
        engine.step()
    for i in (0, 2):
        assert engine.abort(f"abort-{i}").outputs[0].finish_reason == "abort"
    finished = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.outputs[0].token_ids
    assert finished == {f"abort-{i}": reference[i] for i in (1, 3)}
    return "2 aborted, 2 finished"


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("mode", MODES)
def test_async_llm(engines, mode, point):
    """Four concurrent clients, and two more once the fault came. A failed step's clients get
    its error, the others their answers, exact (on a new pool when the old was lost). Cancel:
    one client leaves its stream, one is cancelled, one aborts; the others end as before."""
    llm, reference = engines(mode)
    engine = llm.engine
    front = AsyncLLM(engine=engine)
    try:
        fault = None if point == "cancel" else point
        with FaultPlan(engine, mode, fault) as plan:
            results = asyncio.run(asyncio.wait_for(_clients(front, plan, point), 120))
        stats = wait_idle(front)
        fresh = asyncio.run(asyncio.wait_for(_clients(front, None, None), 120))
        wait_idle(front)
    finally:
        front.shutdown()
    assert_idle(engine)
    outcomes = [_outcome(result, reference[i % len(PROMPTS)]) for i, result in enumerate(results)]
    if point == "cancel":
        assert outcomes[:3] == ["left", "cancelled", "aborted"], outcomes
    else:
        assert plan.fired == 1 and "failed" in outcomes, outcomes
        assert set(outcomes) <= {"done", "failed"}, outcomes
    assert [tokens for _, tokens in fresh] == reference + reference[:LATE]
    summary = {kind: outcomes.count(kind) for kind in dict.fromkeys(outcomes)}
    _report("AsyncLLM", mode, point, ", ".join(f"{n} {kind}" for kind, n in summary.items()), stats)


async def _clients(front: AsyncLLM, plan: FaultPlan | None, point: str | None) -> list:
    """Runs the clients: ("done" | "left" | "aborted", tokens), or what each raised. The late
    ones start once the fault fired (or the cancels came), on the recovered engine, while the
    others still end: before, nothing waits, so the mode's steps run (multi-step)."""
    cancel = point == "cancel"

    async def client(i: int):
        tokens, kind = [], "aborted"
        stream = front.generate(PROMPTS[i % len(PROMPTS)], GREEDY, request_id=f"c{i}")
        async with contextlib.aclosing(stream):
            async for out in stream:
                tokens += out.outputs[0].token_ids
                if out.finished:
                    kind = "done"
                elif cancel and i == 0 and plan.armed():
                    return "left", tokens  # leaves the loop: the stream is closed
                elif cancel and i == 2 and plan.armed():
                    await front.abort(f"c{i}")
        return kind, tokens

    async def until(condition) -> None:
        while not condition():
            await asyncio.sleep(0.002)

    tasks = [asyncio.create_task(client(i)) for i in range(len(PROMPTS))]
    if cancel:  # cancels client 1 while it waits for its next output
        await until(lambda: plan.armed() or tasks[1].done())
        tasks[1].cancel()
    elif plan is not None:
        await until(lambda: plan.fired or all(task.done() for task in tasks))
    tasks += [asyncio.create_task(client(len(PROMPTS) + i)) for i in range(LATE)]
    return await asyncio.gather(*tasks, return_exceptions=True)


def _outcome(result, reference: list[int]) -> str:
    if isinstance(result, asyncio.CancelledError):
        return "cancelled"
    if isinstance(result, BaseException):
        assert isinstance(result, RuntimeError) and "injected fault" in str(result), result
        return "failed"
    kind, tokens = result
    if kind == "done":
        assert tokens == reference
    else:
        assert tokens == reference[: len(tokens)] and len(tokens) < len(reference)
    return kind


def _report(front: str, mode: str, point: str, outcome: str, stats: dict) -> None:
    """One row of the matrix (shown with ``-s``)."""
    left = f"running {stats['num_running']}, waiting {stats['num_waiting']}"
    print(f"\n| {front} | {point} | {mode} | {outcome} | {stats['kv_pages_used']} | {left} |")
