"""``test_step_faults``' property under pressure: a small pool (preemptions), a 16-token budget
(chunked prefill, cut verify rows), clients arriving at random times with random lengths and
shared prompts (their pages shared through the prefix cache), and a fault at a random point
after a random number of steps. Requests outside the failed step (waiting, preempted, arriving
meanwhile) end exactly as without the fault, the others fail; nothing is left behind."""

from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest

from jaxgen import LLM
from jaxgen.async_llm import AsyncLLM
from tests.engine.decoding.speculation_workload import speculation_knobs
from tests.engine.step.fault_plan import GREEDY, MODES, PROMPTS, FaultPlan, assert_idle, wait_idle

pytestmark = pytest.mark.timeout(300)
CLIENTS = 6
# Up to 88 tokens a sequence: four of them outgrow the 12 pages.
LONGEST = dataclasses.replace(GREEDY, max_tokens=60)
FAULT_POINTS = ("launch", "device", "read", "postprocess")
# Seeds run by default, and under ``-m slow``.
SEEDS = [pytest.param(seed, id=f"seed{seed}") for seed in range(2)] + [
    pytest.param(seed, id=f"seed{seed}", marks=pytest.mark.slow) for seed in range(2, 12)
]


@pytest.fixture(scope="module")
def engines(tiny_loaded):
    """mode -> its ``LLM`` (the tight knobs), and "reference" -> each prompt's greedy tokens."""
    knobs = dict(speculation_knobs(tiny_loaded.config), attention_backend="reference")
    built = {mode: LLM(tiny_loaded, **knobs, **extra) for mode, extra in MODES.items()}
    outputs = built["sync"].generate(PROMPTS, LONGEST, use_tqdm=False)
    built["reference"] = [out.outputs[0].token_ids for out in outputs]
    return built


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", MODES)
def test_a_random_fault_leaves_nothing_behind(engines, mode, seed):
    rng = random.Random(f"{mode}-{seed}")
    engine, reference = engines[mode].engine, engines["reference"]
    point = rng.choice(FAULT_POINTS)
    clients = [
        (rng.randrange(len(PROMPTS)), rng.randint(8, LONGEST.max_tokens), rng.uniform(0, 0.05))
        for _ in range(CLIENTS)
    ]
    front = AsyncLLM(engine=engine)
    try:
        with FaultPlan(engine, mode, point, skip=rng.randrange(12)) as plan:
            results = asyncio.run(asyncio.wait_for(_run(front, clients), 120))
        wait_idle(front)
        fresh = asyncio.run(asyncio.wait_for(_run(front, clients[:4]), 120))
        wait_idle(front)
    finally:
        front.shutdown()
    stats = assert_idle(engine)
    failed = 0
    for (prompt, max_tokens, _), result in zip(clients, results, strict=True):
        if isinstance(result, BaseException):
            assert isinstance(result, RuntimeError) and "injected fault" in str(result), result
            failed += 1
        else:
            assert result == reference[prompt][:max_tokens]
    assert bool(failed) == bool(plan.fired), (point, plan.fired, results)
    for (prompt, max_tokens, _), tokens in zip(clients, fresh, strict=False):
        assert tokens == reference[prompt][:max_tokens]
    print(f"\n{mode} {point} fired={plan.fired} failed={failed}/{CLIENTS} stats={_brief(stats)}")


async def _run(front: AsyncLLM, clients) -> list:
    """Each client's tokens, or what it raised; every client at once, each after its delay."""

    async def client(index: int, prompt: int, max_tokens: int, delay: float):
        await asyncio.sleep(delay)
        params = dataclasses.replace(LONGEST, max_tokens=max_tokens)
        tokens = []
        async for out in front.generate(PROMPTS[prompt], params, request_id=f"r{index}"):
            tokens += out.outputs[0].token_ids
        return tokens

    runs = [client(index, *spec) for index, spec in enumerate(clients)]
    return await asyncio.gather(*runs, return_exceptions=True)


def _brief(stats: dict) -> dict:
    keys = ("num_running", "num_waiting", "kv_pages_used", "preemptions", "failed_steps")
    return {key: stats[key] for key in keys}
