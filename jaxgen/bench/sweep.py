"""The latency-throughput sweep: one level per concurrency (closed loop) or request rate (open
loop), each with fresh prompts, then the table, the curve and the knee."""

from __future__ import annotations

import asyncio
import os

from jaxgen.bench import clients, metrics, plots, results
from jaxgen.bench.workloads import Workload, arrival_offsets

MAX_ATTEMPTS = 3  # in process, a level is measured again while compiles land in its window

SWEEP_COLUMNS = {
    "concurrency": "concurrency",
    "request_rate": "rate (req/s)",
    "requests_per_s": "req/s",
    "throughput_tok_s": "output tok/s",
    "latency_ms_per_token": "ms/token",
    "ttft_p50_ms": "TTFT p50",
    "ttft_p90_ms": "TTFT p90",
    "ttft_p99_ms": "TTFT p99",
    "tpot_p50_ms": "TPOT p50",
    "tpot_p90_ms": "TPOT p90",
    "tpot_p99_ms": "TPOT p99",
    "itl_p50_ms": "ITL p50",
    "itl_p99_ms": "ITL p99",
    "e2e_p50_ms": "e2e p50",
    "e2e_p90_ms": "e2e p90",
    "e2e_p99_ms": "e2e p99",
    "mean_in_flight": "in flight",
    "num_failed": "failed",
    "compiles": "compiles",
}


def parse_levels(text: str, kind=int) -> list:
    """``"1,2,4"`` -> ``[1, 2, 4]`` (sorted, distinct, > 0; ``inf`` allowed for rates)."""
    values = sorted({kind(v) for v in text.split(",") if v.strip()})
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"levels must be positive numbers, got {text!r}")
    return values


async def _measure(backend, work, level, *, open_loop, max_concurrency, burstiness, seed, bar):
    """One pass of a level: timings, duration and the row's labels."""
    if open_loop:
        offsets = arrival_offsets(len(work.requests), level, burstiness, seed)
        timings, duration = await clients.open_loop(
            backend, work.requests, offsets, max_concurrency, bar
        )
        labels = dict(
            concurrency=max_concurrency or len(work.requests),
            request_rate=level,
            burstiness=burstiness,
        )
        return timings, duration, labels
    timings, duration = await clients.closed_loop(backend, work.requests, level, bar)
    return timings, duration, dict(concurrency=level)


async def _levels(
    backend,
    make_workload,
    levels: list,
    *,
    open_loop: bool,
    max_concurrency,
    num_prompts: int,
    burstiness: float,
    seed: int,
    warmup: bool,
    price_per_hour,
    progress: bool,
) -> list[dict]:
    from tqdm.auto import tqdm

    rows = []
    try:
        for index, level in enumerate(levels):
            count = num_prompts if open_loop else max(num_prompts, level)
            label = f"rate {level}/s" if open_loop else f"concurrency {level}"
            level_clients = (max_concurrency or count) if open_loop else level
            if warmup:  # compiles this level's batch shapes (first round and staggered refills)
                work = make_workload(min(count, max(4 * level_clients, 8)), seed + 10_000 + index)
                with tqdm(
                    total=len(work.requests), desc=f"warm-up {label}", disable=not progress
                ) as bar:
                    await clients.closed_loop(backend, work.requests, level_clients, bar)
            work = make_workload(count, seed + index)
            for attempt in range(1, MAX_ATTEMPTS + 1):
                compiles = backend.compiles()
                with tqdm(total=count, desc=label, disable=not progress) as bar:
                    timings, duration, labels = await _measure(
                        backend, work, level, open_loop=open_loop, bar=bar,
                        max_concurrency=max_concurrency, burstiness=burstiness, seed=seed + index,
                    )  # fmt: skip
                if compiles is None:
                    break
                labels.update(compiles=backend.compiles() - compiles, attempts=attempt)
                if labels["compiles"] == 0:
                    break  # else a compile landed in the window: measure the level again
            row = metrics.level_row(timings, duration, **labels)
            rows.append(metrics.add_cost(row, price_per_hour))
    finally:
        await backend.close()
    return rows


def run_sweep(
    backend,
    make_workload,
    levels: list,
    *,
    open_loop: bool = False,
    max_concurrency: int | None = None,
    num_prompts: int = 64,
    burstiness: float = 1.0,
    seed: int = 0,
    warmup: bool = True,
    price_per_hour: float | None = None,
    progress: bool = True,
) -> list[dict]:
    """Runs every level; ``make_workload(count, seed)`` gives each level fresh prompts (so the
    prefix cache does not carry one level's prompts into the next)."""
    return asyncio.run(
        _levels(
            backend,
            make_workload,
            levels,
            open_loop=open_loop,
            max_concurrency=max_concurrency,
            num_prompts=num_prompts,
            burstiness=burstiness,
            seed=seed,
            warmup=warmup,
            price_per_hour=price_per_hour,
            progress=progress,
        )
    )


def knee_summary(rows: list[dict], open_loop: bool = False) -> dict:
    """The knee (first level after which throughput gains < 10% per doubling of the load) and the
    level with the best throughput/latency ratio."""
    key = "request_rate" if open_loop else "concurrency"
    xs = [r[key] for r in rows]
    throughputs = [r["throughput_tok_s"] for r in rows]
    knee = metrics.find_knee(xs, throughputs)
    efficiency = metrics.best_efficiency(throughputs, [r["latency_ms_per_token"] for r in rows])
    return {
        "definition": "first level after which output throughput grows < 10% per doubling of "
        f"{key}",
        "knee_index": knee,
        f"knee_{key}": xs[knee] if knee is not None else None,
        "knee_throughput_tok_s": throughputs[knee] if knee is not None else None,
        "best_efficiency_index": efficiency,
        f"best_efficiency_{key}": xs[efficiency] if efficiency is not None else None,
    }


def write_sweep(
    out_dir: str,
    env: dict,
    rows: list[dict],
    *,
    workload: Workload,
    backend_name: str,
    open_loop: bool = False,
    prediction: dict | None = None,
) -> dict:
    """``results.json``, ``results.md`` and ``curve.png`` in ``out_dir``; returns the knee."""
    knee = knee_summary(rows, open_loop)
    columns = dict(SWEEP_COLUMNS)
    if not open_loop:
        columns.pop("request_rate")
    if any("cost_per_1m_output_tokens" in r for r in rows):
        columns["cost_per_1m_output_tokens"] = "cost / 1M tokens"
    key = "request_rate" if open_loop else "concurrency"
    notes = [
        f"Workload: {workload.name}; backend: {backend_name}; "
        + ("open loop (gamma arrivals)" if open_loop else "closed loop")
        + ".",
        "ms/token = mean over requests of e2e latency / output tokens (TTFT included); "
        "TPOT = (e2e - TTFT) / (output tokens - 1); latencies in ms.",
        f"Knee ({knee['definition']}): {key} = {knee.get(f'knee_{key}')}; best "
        f"throughput/latency at {key} = {knee.get(f'best_efficiency_{key}')}.",
    ]
    if prediction and prediction.get("predicted_knee") is not None:
        parts = ", ".join(
            f"{k} = {prediction[k]:.0f}"
            for k in ("critical_batch", "kv_capacity_sequences", "max_batch")
            if k in prediction
        )
        notes.append(
            f"Predicted knee (concurrency): {prediction['predicted_knee']:.0f} = min({parts})."
        )
    results.write_results(
        out_dir,
        env,
        rows,
        title="jaxgen bench sweep",
        columns=columns,
        extra={
            "workload": workload.describe(),
            "backend": backend_name,
            "knee": knee,
            "prediction": prediction,
        },
        notes=notes,
    )
    predicted = (prediction or {}).get("predicted_knee") if not open_loop else None
    plots.plot_curve(
        rows,
        os.path.join(out_dir, "curve.png"),
        knee=knee["knee_index"],
        efficiency=knee["best_efficiency_index"],
        label_key=key,
        title=f"jaxgen sweep: {workload.name}",
        predicted_knee=predicted,
    )
    return knee
