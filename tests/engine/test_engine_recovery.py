"""A failed step leaves a working engine (the donated KV pool is reallocated and the other
requests recomputed), or a dead one that says so. Faults are injected into the jitted step."""

from __future__ import annotations

import asyncio

import jax
import pytest

from jaxgen.async_llm import AsyncLLM
from jaxgen.engine.errors import EngineDeadError
from jaxgen.sampling_params import SamplingParams
from serving.testing import TINY_ENGINE_KNOBS

# Longer than two pages, so a stale prefix cache after the pool is replaced would show.
PROMPTS = [f"{topic} " * 12 for topic in ("The quick brown fox", "Once upon a time", "Paris is")]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


class DeviceFault(RuntimeError):
    """Stands in for a device fault or an out-of-memory while the step executes."""


def inject_fault(runner, times: int | None = 1):
    """Makes the next ``times`` runs of the jitted step (every run if None) fail after the
    pool was donated to them, as a fault during execution does: the pool they were given is
    deleted, and so is the one they produced (the runner's ``after_step`` hook)."""
    left = [times]

    def faulty(params, kv_cache):
        if left[0] == 0:
            return
        if left[0] is not None:
            left[0] -= 1
        for leaf in jax.tree_util.tree_leaves(kv_cache):
            leaf.delete()
        raise DeviceFault("injected fault during the step")

    runner.after_step = faulty
    return lambda: setattr(runner, "after_step", None)


async def generate_text(llm: AsyncLLM, prompt: str, params: SamplingParams = GREEDY) -> str:
    text = ""
    async for out in llm.generate(prompt, params):
        text += out.outputs[0].text
    return text


async def generate_all(llm: AsyncLLM, params: SamplingParams = GREEDY) -> list:
    runs = [generate_text(llm, prompt, params) for prompt in PROMPTS]
    return await asyncio.gather(*runs, return_exceptions=True)


@pytest.fixture
def llm(tiny_model_dir):
    llm = AsyncLLM(model=tiny_model_dir, **TINY_ENGINE_KNOBS)
    yield llm
    llm.shutdown()


def wait_idle(llm: AsyncLLM) -> dict:
    async def poll():
        for _ in range(1000):
            stats = llm.stats()
            if stats["num_running"] == stats["num_waiting"] == stats["kv_pages_used"] == 0:
                return stats
            await asyncio.sleep(0.01)
        raise AssertionError(f"engine not idle: {llm.stats()}")

    return asyncio.run(poll())


def test_one_failed_step_fails_its_requests_and_the_engine_recovers(llm):
    before = asyncio.run(generate_all(llm))
    assert all(isinstance(text, str) and text for text in before)
    restore = inject_fault(llm.engine.runner, times=1)
    try:
        failed = asyncio.run(generate_all(llm))
    finally:
        restore()
    assert any(isinstance(result, RuntimeError) for result in failed)
    assert "injected fault" in str(next(r for r in failed if isinstance(r, RuntimeError)))
    stats = wait_idle(llm)
    assert stats["failed_steps"] == 1 and not stats["engine_dead"]
    after = asyncio.run(generate_all(llm))
    assert after == before
    assert wait_idle(llm)["kv_pages_used"] == 0
    assert llm.dead is None


def test_running_requests_outside_the_step_are_recomputed_on_a_new_pool(tiny_model_dir):
    """A sequence that held pages but was not in the failed step is recomputed from its tokens
    on the new pool (its cached K/V went with the old one) and ends as it would have."""
    from jaxgen.config.engine_config import EngineConfig
    from jaxgen.engine.llm_engine import LLMEngine
    from jaxgen.engine.scheduling.scheduler import ScheduledSequence, SchedulerOutput
    from jaxgen.loaders import load_model

    engine = LLMEngine(load_model(tiny_model_dir), EngineConfig(**TINY_ENGINE_KNOBS))
    tokens = engine.tokenizer.encode(PROMPTS[0])

    def finish(request_id: str) -> list[int]:
        while engine.has_unfinished():
            for out in engine.step():
                if out.request_id == request_id and out.finished:
                    return out.outputs[0].token_ids
        raise AssertionError("request did not finish")

    engine.add_request("reference", None, tokens, GREEDY)
    reference = finish("reference")
    kept = engine.add_request("kept", None, tokens, GREEDY)
    engine.step()  # prefill: "kept" now holds pages with computed K/V
    failing = engine.add_request("failing", None, tokens[:3], GREEDY)
    engine.scheduler.schedule()  # admits "failing"
    for leaf in jax.tree_util.tree_leaves(engine.runner.kv_cache):
        leaf.delete()  # what a step that fails after donation leaves behind
    step = SchedulerOutput([ScheduledSequence(failing.seqs[0], 3)], [])
    error = engine.recover(step, DeviceFault("injected"))
    assert error.request_ids == ["failing"] and failing.finished
    assert failing.seqs[0].finish_reason == "error"
    assert kept.seqs[0].num_computed_tokens == 0 and not kept.seqs[0].block_table
    assert finish("kept") == reference
    assert engine.stats()["kv_pages_used"] == 0 and engine.stats()["preemptions"] == 0


def test_a_fault_on_every_step_kills_the_engine(llm):
    restore = inject_fault(llm.engine.runner, times=None)
    try:
        for _ in range(3):  # each step fails; the third in a row gives up
            results = asyncio.run(generate_all(llm))
            assert all(isinstance(result, RuntimeError) for result in results)
            if llm.dead is not None:
                break
    finally:
        restore()
    assert isinstance(llm.dead, EngineDeadError)
    with pytest.raises(EngineDeadError):
        asyncio.run(generate_text(llm, PROMPTS[0]))
    stats = wait_idle(llm)
    assert stats["engine_dead"] and stats["failed_steps"] >= 3


def test_lost_parameters_kill_the_engine_at_once(llm):
    asyncio.run(generate_text(llm, PROMPTS[0]))
    runner = llm.engine.runner

    def fault_losing_everything(params, kv_cache):
        for leaf in jax.tree_util.tree_leaves(params):
            leaf.delete()
        raise DeviceFault("injected fault that took the weights")

    runner.after_step = fault_losing_everything
    result = asyncio.run(generate_all(llm))
    assert all(isinstance(r, RuntimeError) for r in result)
    assert isinstance(llm.dead, EngineDeadError) and "parameters" in str(llm.dead)
    assert llm.stats()["failed_steps"] == 1
