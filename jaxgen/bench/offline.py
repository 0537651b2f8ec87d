"""Offline throughput of ``LLM.generate``: a cold pass (compiles included), then a warm pass."""

from __future__ import annotations

import time

from jaxgen.bench import metrics
from jaxgen.bench.workloads import Workload

COUNTERS = (
    "steps",
    "step_time_s",
    "compiles",
    "preemptions",
    "prefix_cache_hit_pages",
    "generation_tokens_total",
    "prompt_tokens_total",
)


class DeviceTimer:
    """Times an engine's jitted step until its results are ready (``ModelRunner.time_device``
    while the timer is entered).

    ``device_s`` is time inside the jitted call (dispatch + device work); the rest of the
    engine's ``step_time_s`` is host work (batch layout, sampling tensors, transfers).
    With ``track_kv`` it also sums, after each step (a step observer), cached tokens and
    reserved page slots (``kv_waste_mean``); that costs host time, so only the cold pass does
    it.
    """

    def __init__(self, engine, track_kv: bool = False):
        self.engine = engine
        self.runner = getattr(engine, "runner", None)
        self.scheduler = getattr(engine, "scheduler", None)
        self.track_kv = track_kv
        self.device_s = 0.0
        self.kv_tokens = 0
        self.kv_slots = 0
        self._unsubscribe = None
        self._device_before = 0.0

    @property
    def kv_waste_mean(self) -> float | None:
        """1 - cached tokens / reserved token slots, summed over steps."""
        return 1.0 - self.kv_tokens / self.kv_slots if self.kv_slots else None

    @property
    def available(self) -> bool:
        """Whether the engine times its steps (``ModelRunner.time_device``) and tells of them
        (``LLMEngine.observers``): a wrapped engine may not."""
        return hasattr(self.runner, "time_device") and hasattr(self.engine, "observers")

    def __enter__(self) -> DeviceTimer:
        if not self.available:
            return self
        self.runner.time_device = True
        self._device_before = self.runner.device_seconds
        if self.track_kv:
            self._unsubscribe = self.engine.observers.add(self._count_kv)
        return self

    def _count_kv(self, event) -> None:
        """The KV pool after each step: tokens cached against the slots their pages hold."""
        self.kv_tokens += self.scheduler.cached_tokens()
        self.kv_slots += self.scheduler.allocator.num_used_pages * self.runner.page_size

    def __exit__(self, *exc) -> None:
        if not self.available:
            return
        self.runner.time_device = False
        self.device_s = self.runner.device_seconds - self._device_before
        if self._unsubscribe is not None:
            self._unsubscribe()


def _pass(llm, workload: Workload, name: str, use_tqdm: bool, track_kv: bool = False) -> dict:
    prompts, params = workload.prompts(), workload.sampling_params()
    before = llm.stats()
    timer = DeviceTimer(llm.engine, track_kv)
    with timer:
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=use_tqdm)
        seconds = time.perf_counter() - start
    after = llm.stats()
    delta = {key: after[key] - before[key] for key in COUNTERS}
    output_tokens = sum(len(o.token_ids) for o in outputs)
    mismatches = sum(
        len(o.token_ids) != r.output_len for o, r in zip(outputs, workload.requests, strict=True)
    )
    step_time = delta["step_time_s"]
    capacity = after["kv_pages_peak"] * after["page_size"]
    latencies = _request_latencies(outputs)
    timed = timer.available and step_time > 0
    return {
        "pass": name,
        "seconds": seconds,
        "output_tokens": output_tokens,
        "output_tok_s": output_tokens / seconds,
        "total_tok_s": (output_tokens + workload.input_tokens) / seconds,
        "steps": delta["steps"],
        "mean_step_ms": 1000.0 * step_time / max(delta["steps"], 1),
        "output_tokens_per_step": output_tokens / max(delta["steps"], 1),
        "compiles": delta["compiles"],
        "preemptions": delta["preemptions"],
        "prefix_cache_hit_pages": delta["prefix_cache_hit_pages"],
        "kv_pages_peak": after["kv_pages_peak"],
        "kv_tokens_peak": after["kv_tokens_peak"],
        "kv_pages_total": after["kv_pages_total"],
        "page_size": after["page_size"],
        "kv_waste": 1.0 - after["kv_tokens_peak"] / capacity if capacity else None,
        "kv_waste_mean": timer.kv_waste_mean,
        "step_time_s": step_time,
        "device_time_s": timer.device_s if timed else None,
        "host_share_of_step": (step_time - timer.device_s) / step_time if timed else None,
        "host_share_of_wall": (seconds - timer.device_s) / seconds if timed else None,
        "length_mismatches": mismatches,
        **latencies,
    }


def _request_latencies(outputs) -> dict:
    """TTFT and e2e percentiles from the engine's per-request metrics (all arrive at once)."""
    ttft, e2e = [], []
    for out in outputs:
        m = out.metrics or {}
        if m.get("arrival_time") is not None and m.get("finish_time") is not None:
            e2e.append(m["finish_time"] - m["arrival_time"])
            if m.get("first_token_time") is not None:
                ttft.append(m["first_token_time"] - m["arrival_time"])
    row = {}
    for name, values in (("ttft", ttft), ("e2e", e2e)):
        for q in (50, 99):
            row[f"{name}_p{q}_ms"] = 1000.0 * metrics.percentile(values, q)
    return row


def run_offline(
    llm,
    workload: Workload,
    *,
    warmup: bool = True,
    use_tqdm: bool = True,
    warmup_workload: Workload | None = None,
) -> dict:
    """Cold pass, then (``warmup``) the same workload again with the prefix cache emptied first,
    so the warm pass measures steady-state speed, not reuse of the cold pass's prompt pages.
    ``warmup_workload`` (e.g. a few prompts of the same shape) replaces the cold pass.

    Returns ``{"cold": row, "warm": row or None}``.
    """
    first = warmup_workload if warmup and warmup_workload is not None else workload
    cold = _pass(llm, first, "cold", use_tqdm, track_kv=True)
    warm = None
    if warmup:
        llm.engine.reset_prefix_cache()
        warm = _pass(llm, workload, "warm", use_tqdm)
    return {"cold": cold, "warm": warm}


def headline(result: dict) -> dict:
    """One row: the warm pass (or the cold one) plus the cold pass's throughput and compiles."""
    main = dict(result["warm"] or result["cold"])
    main["cold_output_tok_s"] = result["cold"]["output_tok_s"]
    main["cold_compiles"] = result["cold"]["compiles"]
    main["kv_waste_mean"] = result["cold"]["kv_waste_mean"]
    return main


OFFLINE_COLUMNS = {
    "pass": "pass",
    "seconds": "seconds",
    "output_tok_s": "output tok/s",
    "total_tok_s": "in+out tok/s",
    "steps": "steps",
    "mean_step_ms": "ms/step",
    "compiles": "compiles",
    "kv_pages_peak": "KV pages peak",
    "kv_waste": "KV waste at peak",
    "kv_waste_mean": "KV waste mean",
    "preemptions": "preemptions",
    "host_share_of_step": "host share of step",
    "host_share_of_wall": "host share of wall",
}
