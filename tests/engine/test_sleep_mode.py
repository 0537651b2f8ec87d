"""Sleep mode (``jaxgen.engine.weights.sleep_mode``, vLLM's levels): level 1 frees the KV pool
and the weights on the device and ``wake_up`` restores them, level 2 discards the weights until
``update_weights``; memory is measured freed and restored (``jax.live_arrays()`` bytes), the
engine generates what it generated before, requests meanwhile are refused, and the calls the
state does not allow are clear errors."""

from __future__ import annotations

import gc

import jax
import numpy as np
import pytest

from jaxgen import LLM, SamplingParams
from jaxgen.engine.compiled.compile_counter import compile_count
from jaxgen.engine.errors import EngineBusyError, EngineSleepingError, SleepModeError
from jaxgen.engine.weights import memory_in_use, named_values

KNOBS = dict(max_model_len=128, kv_cache_memory=1 << 20, page_size=16)
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=1)
PROMPTS = [list(range(5, 45)), [7, 8, 9]]


def run(llm) -> list:
    return [(o.token_ids, o.logprobs) for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    """An engine that owns its weights (loaded for it alone), so sleeping frees them."""
    return LLM(tiny_model_dir, **KNOBS)


@pytest.fixture(scope="module")
def before(llm):
    return run(llm)


def live_bytes() -> int:
    gc.collect()  # what other tests left in reference cycles does not count
    return memory_in_use()["live_array_bytes"]


def test_level_1_frees_the_pool_and_the_weights_and_wake_up_restores_them(llm, before):
    stats = llm.stats()
    awake = live_bytes()
    llm.sleep(level=1)
    asleep = live_bytes()
    # Freed: the pool, the weights as loaded, and the CPU backend's packed copies of them.
    assert awake - asleep >= stats["kv_pool_bytes"] + stats["parameter_bytes"]
    assert llm.is_sleeping() and llm.stats()["kv_pool_bytes"] == 0
    assert (
        llm.stats()["sleep_level"] == 1
        and llm.stats()["parameter_bytes"] == stats["parameter_bytes"]
    )
    assert isinstance(named_values(llm.params)["norm.weight"], jax.ShapeDtypeStruct)
    compiles = compile_count()
    llm.wake_up()
    assert live_bytes() == awake and not llm.is_sleeping()
    assert run(llm) == before and compile_count() == compiles


def test_requests_are_refused_while_asleep_and_sleep_waits_for_none(llm, before):
    llm.sleep(level=1)
    with pytest.raises(EngineSleepingError, match="wake_up"):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    with pytest.raises(EngineSleepingError):
        llm.precompile()
    llm.wake_up()
    engine = llm.engine
    engine.add_request("busy", None, PROMPTS[1], GREEDY)
    with pytest.raises(EngineBusyError, match="unfinished"):
        llm.sleep()
    assert not llm.is_sleeping()
    while engine.has_unfinished():  # the request is not lost
        outputs = engine.step()
    assert outputs[-1].token_ids == before[1][0]


def test_level_2_discards_the_weights_until_update_weights(llm, before):
    weights = {name: np.array(v) for name, v in named_values(llm.params).items()}
    stats, awake = llm.stats(), live_bytes()
    llm.sleep(level=2)
    kept = weights["inv_freq"].nbytes  # the RoPE table stays, as vLLM keeps its buffers
    assert awake - live_bytes() >= stats["kv_pool_bytes"] + stats["parameter_bytes"] - kept
    with pytest.raises(SleepModeError, match="discarded by sleep\\(level=2\\)"):
        llm.wake_up()
    with pytest.raises(SleepModeError, match="discarded"):
        llm.wake_up(tags=["weights"])
    assert llm.is_sleeping()
    trainable = {k: v for k, v in weights.items() if k != "inv_freq"}  # the RoPE table is kept
    llm.update_weights(trainable)
    assert llm.is_sleeping()  # the pool still sleeps
    llm.wake_up()
    assert live_bytes() == awake
    assert run(llm) == before


def test_level_1_then_new_weights_wakes_the_weights_first(llm, before):
    weights = {name: np.array(v) for name, v in named_values(llm.params).items()}
    llm.sleep(level=1)
    with pytest.raises(SleepModeError, match="level 1"):
        llm.update_weights(weights)
    llm.wake_up(tags=["weights"])
    llm.update_weights(weights)
    with pytest.raises(SleepModeError, match="weights are awake"):
        llm.wake_up(tags=["weights"])
    llm.wake_up(tags=["kv_cache"])
    assert run(llm) == before


def test_sleep_and_wake_up_twice_and_bad_arguments_are_clear_errors(llm, before):
    weights = {name: np.array(v) for name, v in named_values(llm.params).items()}
    with pytest.raises(SleepModeError, match="awake"):
        llm.wake_up()
    for level in (0, 3, True, "1"):
        with pytest.raises(ValueError, match="level must be 1 or 2"):
            llm.sleep(level)
    llm.sleep(level=2)
    with pytest.raises(SleepModeError, match="asleep already \\(level 2\\)"):
        llm.sleep(level=1)
    for tags in (["bogus"], "weights", []):
        with pytest.raises(ValueError, match="tags"):
            llm.wake_up(tags=tags)
    llm.wake_up(tags=["kv_cache"])
    with pytest.raises(SleepModeError, match="kv_cache are awake"):
        llm.wake_up(tags=["kv_cache"])
    assert llm.is_sleeping()  # the weights still sleep: they come back with new ones
    llm.update_weights(weights)
    assert not llm.is_sleeping() and run(llm) == before


def test_a_draft_model_sleeps_and_wakes_with_the_target(tiny_model_dir):
    draft = {"method": "draft_model", "model": tiny_model_dir, "num_speculative_tokens": 2}
    llm = LLM(tiny_model_dir, **KNOBS, speculative_config=draft)
    before = run(llm)
    draft_engine = llm.engine.speculator.draft_engine
    weights = {name: np.array(v) for name, v in named_values(llm.params).items()}
    llm.sleep(level=2)
    assert draft_engine.is_sleeping() and draft_engine.stats()["kv_pool_bytes"] == 0
    llm.update_weights(weights)
    assert draft_engine.is_sleeping()  # until the target is awake
    llm.wake_up()
    assert not draft_engine.is_sleeping()
    assert run(llm) == before and llm.stats()["spec_decode_num_drafts"] > 0
