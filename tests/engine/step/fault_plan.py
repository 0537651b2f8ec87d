"""Faults injected where an engine step can fail, through the engine's and the runner's hooks
(``LLMEngine.fault_hook`` for the host stages, ``ModelRunner.after_step`` and ``before_fetch``
for the device), armed once the engine runs its mode's own steps; and the check that nothing a
step held is left behind (``assert_idle``)."""

from __future__ import annotations

import time

import jax

from jaxgen.sampling_params import SamplingParams
from tests.engine.decoding.speculation_workload import PAGE, repeating_prompts
from tests.engine.scheduling.page_allocator_checks import check_balance

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
# The engine modes, each one's knobs over ``knobs``.
MODES = {
    "sync": {},
    "ahead": {"async_scheduling": True},
    "multi-step": {"num_scheduler_steps": 4},
    "speculative": {"speculative_config": NGRAM},
    # Steps that may carry drafts run synchronously, the others ahead.
    "speculative-ahead": {"speculative_config": NGRAM, "async_scheduling": True},
}
# Where a step fails: building its batch (host), running it (device: the donated pool lost),
# reading its result (where a device error surfaces: the pool lost too), handing its tokens to
# the requests (host); and its requests cancelled mid-stream.
POINTS = ("launch", "device", "read", "postprocess", "cancel")
PROMPTS = repeating_prompts()  # n-gram drafts find spans to repeat
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def knobs(config) -> dict:
    """Chunked prefill (a 32-token budget), four sequences at a time, 24 pages of 16 tokens:
    room for the four prompts' whole sequences, so multi-step calls run."""
    per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4
    return dict(
        attention_backend="reference",
        max_model_len=128,
        max_rolling_batch_prefill_tokens=32,
        max_rolling_batch_size=4,
        page_size=PAGE,
        kv_cache_memory=25 * PAGE * per_token,
    )


class InjectedFault(RuntimeError):
    """Stands in for a host error, a device fault or an out-of-memory."""


def _mode_steps(engine, mode: str) -> int:
    """The count of steps that show ``mode`` at work: steps that ran, steps launched ahead,
    multi-step calls, verified drafts."""
    if mode.startswith("speculative"):
        return engine.speculator.num_drafts
    name = {"sync": "num_steps", "ahead": "async_steps", "multi-step": "multi_step_calls"}[mode]
    return getattr(engine, name)


# How many of them come before a fault: mid-stream, past the prompts' chunked prefill.
_ARM_AFTER = {"sync": 4, "ahead": 2, "multi-step": 1, "speculative": 1, "speculative-ahead": 1}


class FaultPlan:
    """One ``error`` raised the first time the engine reaches ``point`` once ``armed``, after
    ``skip`` times more (None: never, the plan only tells when it is armed). The device points
    lose the KV pool first, as a fault after the pool was donated to the step does. A context
    manager: the hooks are the plan's inside it only."""

    def __init__(
        self, engine, mode: str, point: str | None, error: type = InjectedFault, skip: int = 0
    ):
        self.engine, self.mode, self.point, self.error = engine, mode, point, error
        self.baseline = _mode_steps(engine, mode)
        self.skip = skip
        self.fired = 0

    def armed(self) -> bool:
        return _mode_steps(self.engine, self.mode) - self.baseline >= _ARM_AFTER[self.mode]

    def _at(self, point: str, kv_cache=None) -> None:
        if point != self.point or self.fired or not self.armed():
            return
        if self.skip > 0:
            self.skip -= 1
            return
        self.fired += 1
        for leaf in jax.tree_util.tree_leaves(kv_cache):
            leaf.delete()
        raise self.error(f"injected fault at {point} ({self.mode})")

    def __enter__(self) -> FaultPlan:
        runner = self.engine.runner
        self.engine.fault_hook = self._at
        runner.after_step = lambda params, kv_cache: self._at("device", kv_cache)
        runner.before_fetch = lambda params, kv_cache: self._at("read", kv_cache)
        return self

    def __exit__(self, *exc) -> None:
        self.engine.fault_hook = None
        self.engine.runner.after_step = self.engine.runner.before_fetch = None


def assert_idle(engine) -> dict:
    """No request, sequence or page left: nothing running or waiting, every page free exactly
    once (reference counts 0), the engine alive. Returns its stats."""
    stats = engine.stats()
    left = (stats["num_running"], stats["num_waiting"], stats["kv_pages_used"])
    assert left == (0, 0, 0), stats
    assert not engine.requests and not engine.seq_to_request
    check_balance(engine.scheduler.allocator, [])
    assert engine.dead is None
    return stats


def wait_idle(front) -> dict:
    """Waits (5 s at most) for the engine thread to have nothing left: no request, no
    sequence, no page, no step in flight."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        stats, engine = front.stats(), front.engine
        idle = stats["num_running"] == stats["num_waiting"] == stats["kv_pages_used"] == 0
        if idle and not engine.requests and not engine.has_unfinished():
            return stats
        time.sleep(0.005)
    raise AssertionError(f"not idle once the clients are done: {front.stats()}")
