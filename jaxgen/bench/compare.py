"""Batching strategies side by side: one loaded model, the same workloads, one engine per mode."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os

import jax.numpy as jnp

from jaxgen.async_llm import AsyncLLM
from jaxgen.bench import clients, metrics, plots, results
from jaxgen.bench.offline import DeviceTimer, headline, run_offline
from jaxgen.bench.workloads import (
    MIXED_OUTPUT_LENGTHS,
    Workload,
    arrival_offsets,
    random_workload,
    with_mixed_outputs,
)
from jaxgen.llm import LLM


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A workload shape; ``mixed_outputs``: output lengths drawn from these; ``arrivals``:
    Poisson arrivals through ``AsyncLLM`` (else offline, everything at once)."""

    title: str
    input_len: int
    output_len: int
    mixed_outputs: tuple[int, ...] | None = None
    arrivals: bool = False

    def workload(self, tokenizer, num_prompts: int, seed: int = 0) -> Workload:
        work = random_workload(tokenizer, num_prompts, self.input_len, self.output_len, seed=seed)
        return with_mixed_outputs(work, self.mixed_outputs, seed) if self.mixed_outputs else work


SCENARIOS = {
    1: Scenario("1: short in, long out (32/128)", 32, 128),
    2: Scenario("2: long in, short out (256/32)", 256, 32),
    3: Scenario(
        "3: mixed out (64 in, 64/128/256 out), Poisson arrivals",
        64,
        128,
        mixed_outputs=MIXED_OUTPUT_LENGTHS,
        arrivals=True,
    ),
}
MODES = ("none", "static", "dynamic", "continuous", "paged")
WARMUP_REPLAYS = 3

COMPARE_COLUMNS = {
    "scenario": "scenario",
    "mode": "mode",
    "output_tok_s": "output tok/s",
    "speedup_vs_none": "x none",
    "ttft_p50_ms": "TTFT p50 ms",
    "ttft_p99_ms": "TTFT p99 ms",
    "e2e_p50_ms": "e2e p50 ms",
    "e2e_p99_ms": "e2e p99 ms",
    "steps": "steps",
    "kv_pages_peak": "KV pages peak",
    "kv_waste": "KV waste at peak",
    "kv_waste_mean": "KV waste mean",
    "preemptions": "preemptions",
    "cold_compiles": "compiles (warm-up)",
    "compiles": "compiles (measured)",
}


def mode_knobs(
    mode: str,
    *,
    batch_size: int = 4,
    max_batch_delay: float = 0.1,
    max_rolling_batch_size: int = 32,
) -> dict:
    """Engine knobs of one strategy."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    knobs = {"batching": mode}
    if mode in ("static", "dynamic"):
        knobs["batch_size"] = batch_size
    if mode == "dynamic":
        knobs["max_batch_delay"] = max_batch_delay
    if mode in ("continuous", "paged"):
        knobs["max_rolling_batch_size"] = max_rolling_batch_size
    return knobs


def kv_budget_bytes(loaded, max_model_len: int, slots: int) -> int:
    """KV bytes for ``slots`` sequences of ``max_model_len`` (what ``continuous`` reserves): the
    same budget for every mode."""
    itemsize = jnp.dtype(loaded.dtype).itemsize
    return loaded.config.kv_bytes_per_token(itemsize) * max_model_len * slots


def _warmup_subset(workload: Workload, slots: int) -> Workload:
    count = min(len(workload.requests), max(2 * slots, 8))
    return Workload(workload.name + " (warm-up)", workload.requests[:count])


def _offline_row(llm, workload: Workload, slots: int, progress: bool, warmup: bool) -> dict:
    result = run_offline(
        llm,
        workload,
        warmup=warmup,
        use_tqdm=progress,
        warmup_workload=_warmup_subset(workload, slots),
    )
    row = headline(result)
    if not warmup:
        row["cold_compiles"] = 0
    return row


def _replay(llm, workload: Workload, offsets: list[float], progress: bool, desc: str):
    """Sends ``workload`` at ``offsets`` through an ``AsyncLLM`` over ``llm``'s engine."""
    from tqdm.auto import tqdm

    engine = AsyncLLM(engine=llm.engine)
    backend = clients.EngineBackend(engine)
    try:
        with tqdm(total=len(workload.requests), desc=desc, disable=not progress) as bar:
            return asyncio.run(clients.open_loop(backend, workload.requests, offsets, None, bar))
    finally:
        engine.shutdown()


def _arrivals_row(
    llm, workload: Workload, slots: int, arrivals: dict, progress: bool, warmup: bool
) -> dict:
    """Poisson arrivals; the warm-up replays the first prompts with their arrival times, so it
    compiles the batch shapes the measured run meets. Batches under arrivals depend on timing,
    so it replays again while a replay still compiled something (at most WARMUP_REPLAYS)."""
    offsets = arrival_offsets(len(workload.requests), **arrivals)
    compiles_before = llm.stats()["compiles"]
    timer = DeviceTimer(llm.engine, track_kv=True)
    if warmup:
        warm = _warmup_subset(workload, slots)
        for _ in range(WARMUP_REPLAYS):
            compiles = llm.stats()["compiles"]
            with timer:
                _replay(llm, warm, offsets[: len(warm.requests)], progress, "warm-up")
            llm.engine.reset_prefix_cache()
            if llm.stats()["compiles"] == compiles:
                break
    before = llm.stats()
    timings, duration = _replay(llm, workload, offsets, progress, "arrivals")
    after = llm.stats()
    level = metrics.level_row(timings, duration)
    capacity = after["kv_pages_peak"] * after["page_size"]
    keys = ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms", "tpot_p50_ms", "num_failed")
    return {
        "seconds": duration,
        "output_tokens": level["output_tokens"],
        "output_tok_s": level["throughput_tok_s"],
        "requests_per_s": level["requests_per_s"],
        **{k: level[k] for k in keys},
        "steps": after["steps"] - before["steps"],
        "kv_pages_peak": after["kv_pages_peak"],
        "kv_tokens_peak": after["kv_tokens_peak"],
        "kv_waste": 1.0 - after["kv_tokens_peak"] / capacity if capacity else None,
        "kv_waste_mean": timer.kv_waste_mean,
        "preemptions": after["preemptions"] - before["preemptions"],
        "cold_compiles": before["compiles"] - compiles_before,
        "compiles": after["compiles"] - before["compiles"],
    }


def run_compare(
    loaded,
    modes,
    scenarios,
    *,
    num_prompts: int = 64,
    max_model_len: int = 512,
    max_rolling_batch_size: int = 32,
    batch_size: int = 4,
    max_batch_delay: float = 0.1,
    request_rate: float = 2.0,
    burstiness: float = 1.0,
    kv_cache_memory: int | None = None,
    seed: int = 0,
    progress: bool = True,
    warmup: bool = True,
    **engine_knobs,
) -> list[dict]:
    """One row per (scenario, mode); every engine shares ``loaded`` and the KV budget."""
    kv = kv_cache_memory or kv_budget_bytes(loaded, max_model_len, max_rolling_batch_size)
    rows = []
    for item in scenarios:
        scenario = item if isinstance(item, Scenario) else SCENARIOS[int(item)]
        workload = scenario.workload(loaded.tokenizer, num_prompts, seed)
        for mode in modes:
            knobs = mode_knobs(
                mode,
                batch_size=batch_size,
                max_batch_delay=max_batch_delay,
                max_rolling_batch_size=max_rolling_batch_size,
            )
            if progress:
                print(f"[compare] scenario {scenario.title} | mode {mode}", flush=True)
            llm = LLM(
                loaded, max_model_len=max_model_len, kv_cache_memory=kv, **knobs, **engine_knobs
            )
            slots = llm.engine.batching.num_slots
            try:
                if scenario.arrivals:
                    arrivals = dict(rate=request_rate, burstiness=burstiness, seed=seed)
                    row = _arrivals_row(llm, workload, slots, arrivals, progress, warmup)
                else:
                    row = _offline_row(llm, workload, slots, progress, warmup)
            finally:
                del llm
                gc.collect()
            row = {
                "scenario": scenario.title,
                "mode": mode,
                "slots": slots,
                "workload": workload.describe(),
                **row,
            }
            rows.append(row)
        base = next(
            (
                r["output_tok_s"]
                for r in rows
                if r["scenario"] == scenario.title and r["mode"] == "none"
            ),
            None,
        )
        for r in rows:
            if r["scenario"] == scenario.title and base:
                r["speedup_vs_none"] = r["output_tok_s"] / base
    return rows


def write_compare(out_dir: str, env: dict, rows: list[dict], *, settings: dict) -> None:
    """``results.json``, ``results.md``, ``compare.png`` (throughput) and ``latency.png``."""
    notes = [
        f"Settings: {', '.join(f'{k}={v}' for k, v in settings.items())}.",
        "Scenarios 1-2: offline LLM.generate (all requests at once) after a warm-up on the first "
        "prompts; scenario 3: Poisson arrivals through AsyncLLM.",
        "KV waste at peak = 1 - kv_tokens_peak / (kv_pages_peak x page_size) (the engine's "
        "snapshot when its page count peaked); KV waste mean = 1 - cached tokens / reserved "
        "page slots summed over the warm-up's steps. Continuous reserves max_model_len per slot.",
        "compiles (measured) > 0 means a compile landed in the measured window.",
    ]
    results.write_results(
        out_dir,
        env,
        rows,
        title="jaxgen bench compare",
        columns=COMPARE_COLUMNS,
        extra={"settings": settings},
        notes=notes,
    )
    plots.plot_bars(
        rows,
        os.path.join(out_dir, "compare.png"),
        value_key="output_tok_s",
        label_key="mode",
        group_key="scenario",
        ylabel="output tokens/s",
        title="output throughput by batching strategy",
    )
    plots.plot_bars(
        rows,
        os.path.join(out_dir, "latency.png"),
        value_key="e2e_p99_ms",
        label_key="mode",
        group_key="scenario",
        ylabel="e2e p99 (ms)",
        title="tail latency by batching strategy",
    )
