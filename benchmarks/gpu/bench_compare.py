"""Stage 7, the seed documents' experiment on the GPU: ``jaxgen bench compare``'s batching
strategies (static, dynamic, continuous, paged) at the 8B shape on one workload of short
prompts and mixed output lengths, offline (every request at once), through
``jaxgen.bench.compare.run_compare`` (a warm-up pass, then the measured one) one mode at a time,
so each finished mode is kept when the budget ends. A child process, last: every mode compiles
its own shapes."""

from __future__ import annotations

import time

from benchmarks.gpu.random_model import random_loaded_model
from benchmarks.gpu.report import log

# Seconds left below which a mode is not started (its compiles alone take longer).
MODE_NEEDS_S = {"gpu": 20.0, "dry-run": 1.0}
ROW_KEYS = (
    "output_tok_s",
    "seconds",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "e2e_p50_ms",
    "e2e_p99_ms",
    "steps",
    "mean_step_ms",
    "kv_pages_peak",
    "kv_waste",
    "preemptions",
    "cold_compiles",
    "compiles",
    "cold_output_tok_s",
)


def run(ctx, budget) -> dict:
    from jaxgen.bench.compare import Scenario, run_compare

    profile = ctx.profile
    start = time.perf_counter()
    loaded = random_loaded_model(profile.model)
    scenario = Scenario(
        f"{profile.compare_input_len} in, mixed out {'/'.join(map(str, profile.compare_outputs))}",
        profile.compare_input_len,
        max(profile.compare_outputs),
        mixed_outputs=profile.compare_outputs,
    )
    settings = {
        "num_prompts": profile.compare_num_prompts,
        "max_rolling_batch_size": profile.compare_slots,
        "batch_size": profile.compare_slots,
        "max_model_len": profile.compare_input_len + max(profile.compare_outputs),
        "page_size": ctx.page_size,
        "attention_backend": ctx.backend,
    }
    result = {
        "scenario": scenario.title,
        "settings": settings,
        "weights_made_s": time.perf_counter() - start,
        "rows": [],
    }
    ctx.partial(result)
    for index, mode in enumerate(profile.compare_modes):
        if not budget.allows(MODE_NEEDS_S[profile.name]):
            result["rows"].append({"mode": mode, "skipped": f"{budget.remaining():.0f} s left"})
            ctx.partial(result)
            continue
        ctx.compile_log.label = f"bench_compare {mode}"
        mode_start = time.perf_counter()
        try:
            (row,) = run_compare(
                loaded,
                [mode],
                [scenario],
                num_prompts=settings["num_prompts"],
                max_model_len=settings["max_model_len"],
                max_rolling_batch_size=settings["max_rolling_batch_size"],
                batch_size=settings["batch_size"],
                seed=index,
                progress=False,
                page_size=settings["page_size"],
                attention_backend=settings["attention_backend"],
            )
            row = {"mode": mode, **{k: row.get(k) for k in ROW_KEYS}}
        except Exception as error:
            row = {"mode": mode, "error": f"{type(error).__name__}: {error}"}
        row["stage_s"] = time.perf_counter() - mode_start
        log(f"compare {mode}: {row.get('output_tok_s')} tok/s in {row['stage_s']:.0f} s")
        result["rows"].append(row)
        ctx.partial(result)
    if any("skipped" in row for row in result["rows"]):
        result["status"] = "partial"
    return result


def summary(result: dict) -> str:
    parts = []
    for row in result.get("rows", []):
        if row.get("output_tok_s") is not None:
            parts.append(f"{row['mode']} {row['output_tok_s']:.0f} tok/s")
        else:
            parts.append(f"{row['mode']} {'skipped' if 'skipped' in row else 'error'}")
    return "; ".join(parts)
