"""Stage 5, end to end (a child process: it holds the 8B model, and its memory goes back to the
GPU when it exits): random Llama-3-8B-shaped bf16 weights made on the device; for each batch
size, prompts of ``prompt_len`` random ids and ``output_len`` greedy tokens (EOS ignored), all
requests added at once. A cold pass (which compiles every shape the batch meets) then a timed
pass with fresh prompts: output tok/s, decode ms/step, the floor (weights + live KV bytes per
step / the measured copy bandwidth), and compiles in the timed pass (target 0). One engine per
batch size, its buckets set to what the batch needs: the whole prefill in one step when the
free memory allows, block tables no wider than the sequences. Then, as the budget allows, the
decode step's memory analysis and the multi-step / asynchronous-scheduling knobs."""

from __future__ import annotations

import gc
import os
import time

import numpy as np

from benchmarks.gpu.engine_run import DecodeCapture, drive
from benchmarks.gpu.floors import (
    decode_floor_seconds,
    mean_decode_context,
    pow2_floor,
    streamed_weight_bytes,
)
from benchmarks.gpu.random_model import parameter_bytes, random_loaded_model
from benchmarks.gpu.report import log
from benchmarks.gpu.word_tokenizer import random_prompts

# Speculation's prompts repeat a random run of this many ids (the random model's output need
# not follow it: the drafts are verified, accepted or not, and the verify steps timed).
PROMPT_PERIOD = 32
# The engine counters a row keeps (speculative decoding's where it speculates).
ENGINE_STATS = (
    "steps",
    "multi_step_calls",
    "async_steps",
    "preemptions",
    "kv_pages_peak",
    "spec_decode_num_drafts",
    "spec_decode_num_draft_tokens",
    "spec_decode_num_accepted_tokens",
    "spec_decode_mean_acceptance_length",
    "spec_decode_draft_token_cost",
)
# Decode step within this many times its floor (issue 40's targets, Llama-3-8B, bf16).
TARGET_X_FLOOR = {1: 1.25, 64: 1.4, 256: 1.6}
# Activation bytes a prefill token may take, per hidden unit and per intermediate unit (about
# six hidden-sized and three MLP-sized bf16 rows, with room to spare).
ACTIVATION_BYTES_PER_HIDDEN = 16
ACTIVATION_BYTES_PER_INTERMEDIATE = 10
FIRST_COMPILE_GUESS_S = {"gpu": 30.0, "dry-run": 5.0}
# Prefill tokens per step at most (vLLM's max_num_batched_tokens is of this order): on an H200
# the whole 256 x 1,024-token prefill in one step asked XLA for 83 GiB of temporaries.
MAX_PREFILL_TOKENS_PER_STEP = 16384


def prefill_token_cap(ctx, config, kv_bytes: int) -> int:
    """Prefill tokens one step may hold: the device memory left once the KV pool is allocated
    (the parent's share and the weights already out), over each token's activation bytes."""
    import jax

    from jaxgen.planning.gpu_targets import jax_gpu_memory_fraction

    stats = jax.devices()[0].memory_stats()
    if not stats:  # CPU: no limit worth computing
        return 1 << 30
    total = stats["bytes_limit"] / jax_gpu_memory_fraction()
    usable = min(stats["bytes_limit"], 0.95 * total - ctx.args.parent_bytes)
    free = usable - stats["bytes_in_use"] - kv_bytes
    per_token = (
        ACTIVATION_BYTES_PER_HIDDEN * config.hidden_size
        + ACTIVATION_BYTES_PER_INTERMEDIATE * config.intermediate_size
    )
    return pow2_floor(max(free, 0) / per_token)


def engine_sizes(ctx, config, batch: int) -> dict:
    """The KV pool's bytes and the prefill tokens per step for ``batch`` sequences."""
    profile = ctx.profile
    max_len = profile.prompt_len + profile.output_len
    pages = batch * -(-max_len // ctx.page_size) + 4
    kv_bytes = pages * ctx.page_size * config.kv_bytes_per_token(2)
    cap = prefill_token_cap(ctx, config, kv_bytes)
    # At least one prompt per step even when the estimate says no room (an OOM is a result).
    cap = min(cap, MAX_PREFILL_TOKENS_PER_STEP)
    tokens = max(16, batch, min(batch * profile.prompt_len, max(cap, profile.prompt_len)))
    return {"prefill_tokens_per_step": tokens, "kv_cache_bytes": kv_bytes}


def engine_for(ctx, loaded, batch: int, knobs: dict):
    """An LLM sized for ``batch`` sequences of prompt + output tokens."""
    from jaxgen import LLM

    profile = ctx.profile
    sizes = engine_sizes(ctx, loaded.config, batch)
    llm = LLM(
        loaded,
        attention_backend=ctx.backend,
        page_size=ctx.page_size,
        max_model_len=profile.prompt_len + profile.output_len,
        max_rolling_batch_size=batch,
        max_rolling_batch_prefill_tokens=sizes["prefill_tokens_per_step"],
        kv_cache_memory=sizes["kv_cache_bytes"],
        enable_prefix_caching=False,
        **knobs,
    )
    return llm, sizes


def periodic_prompts(rng, count: int, length: int, vocab_size: int) -> list[list[int]]:
    """``count`` prompts of ``length`` ids, each a random run of PROMPT_PERIOD ids (a quarter
    of the prompt at most) repeated."""
    period = max(min(PROMPT_PERIOD, length // 4), 1)
    runs = random_prompts(rng, count, period, vocab_size)
    return [(run * -(-length // period))[:length] for run in runs]


def measure(ctx, loaded, batch: int, knobs: dict, *, trace: bool, seed: int) -> dict:
    """Cold pass, then the timed pass; the row of one batch size under ``knobs``."""
    from jaxgen import SamplingParams

    profile = ctx.profile
    llm, sizes = engine_for(ctx, loaded, batch, knobs)
    params = SamplingParams(temperature=0.0, max_tokens=profile.output_len, ignore_eos=True)
    rng = np.random.default_rng(seed)
    vocab = loaded.config.vocab_size
    row = {"batch": batch, "knobs": knobs, **sizes}
    prompts_of = random_prompts
    if "speculative_config" in knobs:  # prompts that repeat themselves: n-grams find drafts
        prompts_of = periodic_prompts
    capture = DecodeCapture(llm.engine.runner)
    try:
        label = f"b{batch}" + "".join(f" {k}={v}" for k, v in knobs.items())
        ctx.compile_log.label = f"end_to_end {label} cold"
        before = ctx.compile_log.snapshot()
        cold = drive(
            llm.engine, prompts_of(rng, batch, profile.prompt_len, vocab), params, tag="cold"
        )
        row["cold"] = {**cold, **ctx.compile_log.since(before)}
        log(f"e2e {label} cold: {cold['seconds']:.1f} s, {row['cold']['compiles']} compiles")
        ctx.compile_log.label = f"end_to_end {label} timed"
        before = ctx.compile_log.snapshot()
        trace_to = os.path.join(ctx.out, f"e2e_trace_b{batch}.json.gz") if trace else None
        warm = drive(
            llm.engine,
            prompts_of(rng, batch, profile.prompt_len, vocab),
            params,
            tag="timed",
            trace_to=trace_to,
            trace_first_step=profile.trace_first_step,
            trace_steps=profile.trace_steps,
        )
        row["timed"] = {**warm, **ctx.compile_log.since(before)}
        device_s = capture.replay_seconds(profile.replay_steps)
        if device_s is not None and warm["decode_ms_per_step"]:
            row["replay_device_ms_per_step"] = 1e3 * device_s
            row["host_ms_per_step"] = max(warm["decode_ms_per_step"] - 1e3 * device_s, 0.0)
        row["engine_stats"] = {k: v for k, v in llm.stats().items() if k in ENGINE_STATS}
        speculator = llm.engine.speculator
        if speculator is not None:  # each (rows, drafted tokens)'s steps and mean ms
            cost = speculator.cost
            row["draft_step_ms"] = {
                f"{rows}x{drafted}": [cost.counts[rows, drafted], 1e3 * seconds]
                for (rows, drafted), seconds in sorted(cost.seconds.items())
            }
        # On the first row whose capture kept a step (not an asynchronous row: at d2b7523 the
        # H200 run's first row was one, and no memory analysis came back).
        analysed = ctx.want_memory_analysis and "speculative_config" not in knobs
        if analysed and capture.arrays is not None:
            ctx.want_memory_analysis = False
            ctx.compile_log.label = f"end_to_end {label} memory analysis"
            before = ctx.compile_log.snapshot()
            row["memory_analysis"] = capture.memory_analysis()
            row["memory_analysis"].update(ctx.compile_log.since(before))
    finally:
        capture.release()
        del llm, capture
        gc.collect()  # the pool goes before the next engine allocates its own
    return row


def add_floor(row: dict, *, weight_bytes: int, kv_per_token: int, context: float, bw) -> None:
    """The decode step's floor at ``bw`` bytes/s and how far the timed step is above it."""
    timed = row.get("timed", {})
    if not bw or not timed.get("decode_ms_per_step"):
        return
    floor_s = decode_floor_seconds(
        weight_bytes=weight_bytes,
        kv_bytes_per_token=kv_per_token,
        context_tokens=row["batch"] * context,
        bandwidth=bw,
    )
    row["floor_ms"] = 1e3 * floor_s
    row["x_floor"] = timed["decode_ms_per_step"] / row["floor_ms"]
    row["fraction_of_floor"] = row["floor_ms"] / timed["decode_ms_per_step"]
    target = TARGET_X_FLOOR.get(row["batch"])
    if target is not None:
        row["target_x_floor"] = target
        row["meets_target"] = row["x_floor"] <= target


def estimate_seconds(ctx, config, batch: int, compile_s: float, floor_args: dict) -> float:
    """A rough cost of one batch size: its compiles (a prefill and a decode shape; five when
    the prefill takes several steps, as sequences then start and end a few steps apart), then
    two passes (cold and timed), each a prefill at the measured matmul rate and a decode at
    twice the floor."""
    profile = ctx.profile
    rate = ctx.args.matmul_rate or 3e14
    bw = ctx.args.copy_bandwidth or 2e12
    one_step = engine_sizes(ctx, config, batch)["prefill_tokens_per_step"] >= (
        batch * profile.prompt_len
    )
    params = floor_args["weight_bytes"] / 2  # bf16
    prefill = 2 * params * batch * profile.prompt_len / rate
    step_bytes = (
        floor_args["weight_bytes"] + batch * floor_args["context"] * floor_args["kv_per_token"]
    )
    decode = 2 * profile.output_len * step_bytes / bw
    return (2 if one_step else 5) * compile_s + 2 * (prefill + decode) + 5


def run(ctx, budget) -> dict:
    profile = ctx.profile
    start = time.perf_counter()
    loaded = random_loaded_model(profile.model)
    sizes = parameter_bytes(loaded)
    config = loaded.config
    kv_per_token = config.kv_bytes_per_token(2)
    weight_bytes = streamed_weight_bytes(
        sizes["param_bytes"], sizes["embedding_bytes"], tied=config.tie_word_embeddings
    )
    result = {
        "model": {**profile.model, **sizes, "weights_made_s": time.perf_counter() - start},
        "backend": ctx.backend,
        "page_size": ctx.page_size,
        "prompt_len": profile.prompt_len,
        "output_len": profile.output_len,
        "copy_bandwidth_Bps": ctx.args.copy_bandwidth,
        "weight_bytes_per_step": weight_bytes,
        "kv_bytes_per_token": kv_per_token,
        "knobs_on_in_rows": profile.e2e_knobs or "none (the engine's defaults)",
        "rows": [],
        "knob_rows": [],
    }
    log(f"e2e weights: {sizes['param_bytes'] / 1e9:.2f} GB in {time.perf_counter() - start:.1f} s")
    ctx.partial(result)
    context = mean_decode_context(profile.prompt_len, profile.output_len)
    floor_args = dict(weight_bytes=weight_bytes, kv_per_token=kv_per_token, context=context)
    compile_s = FIRST_COMPILE_GUESS_S[profile.name]
    main = dict(profile.e2e_knobs)
    main_rows = [(b, main, b in profile.trace_batches, True) for b in profile.e2e_batches]
    speculative = [
        (b, profile.speculative_knobs, False, False) for b in profile.speculative_batches
    ]
    kernel = []
    if ctx.backend == "pallas-gpu":  # kernel options are pallas-gpu's only
        kernel_knobs = profile.kernel_knob_settings
        kernel = [(b, k, False, False) for k in kernel_knobs for b in profile.knob_batches]
    others = [(b, k, False, False) for k in profile.knob_settings for b in profile.knob_batches]
    # Each row's prompts are seeded by its place in this order (the dry run's random model
    # drafts from the speculative row's); the kernel options run before speculation
    # (candidates for the defaults).
    seeded, seed = [], 1000
    for group in (main_rows, speculative, kernel, others):
        seeded.append([(row, seed + i) for i, row in enumerate(group)])
        seed += len(group)
    main_part, spec_part, kernel_part, other_part = seeded
    plan = main_part + kernel_part + spec_part + other_part
    for (batch, knobs, trace, is_main), seed in plan:
        rows = result["rows"] if is_main else result["knob_rows"]
        needed = estimate_seconds(ctx, config, batch, compile_s, floor_args)
        if not budget.allows(needed):
            rows.append(
                {
                    "batch": batch,
                    "knobs": knobs,
                    "skipped": f"needs ~{needed:.0f} s, {budget.remaining():.0f} s left",
                }  # fmt: skip
            )
            ctx.partial(result)
            continue
        try:
            row = measure(ctx, loaded, batch, knobs, trace=trace, seed=seed)
        except Exception as error:
            row = {"batch": batch, "knobs": knobs, "error": f"{type(error).__name__}: {error}"}
            log(f"e2e b{batch} {knobs}: {row['error']}")
        add_floor(row, **floor_args, bw=ctx.args.copy_bandwidth)
        cold = row.get("cold", {})
        if cold.get("compiles"):
            compile_s = max(cold["compile_s"] / cold["compiles"], 1.0)
        rows.append(row)
        timed = row.get("timed", {})
        if timed:
            log(
                f"e2e b{batch} {knobs or ''}: {timed['output_tok_s']:.1f} tok/s, decode "
                f"{timed['decode_ms_per_step'] or float('nan'):.2f} ms/step, "
                f"{row.get('x_floor', float('nan')):.2f}x floor, "
                f"{timed['compiles']} compiles timed"
            )
        ctx.partial(result)
    if any("skipped" in row for row in result["rows"] + result["knob_rows"]):
        result["status"] = "partial"
    return result


def table_rows(result: dict) -> list[dict]:
    rows = []
    for row in result.get("rows", []) + result.get("knob_rows", []):
        timed = row.get("timed", {})
        rows.append(
            {
                "batch": row["batch"],
                "knobs": knob_label(row.get("knobs", {})),
                "tok/s": timed.get("output_tok_s"),
                "ms/step": timed.get("decode_ms_per_step"),
                "floor ms": row.get("floor_ms"),
                "x floor": row.get("x_floor"),
                "device ms": row.get("replay_device_ms_per_step"),
                "host ms": row.get("host_ms_per_step"),
                "compiles": timed.get("compiles"),
                "note": row.get("skipped") or row.get("error"),
            }
        )
    return rows


def knob_label(knobs: dict) -> str:
    """A row's knobs in a table cell (speculation as its method and k)."""
    parts = []
    for key, value in knobs.items():
        if key == "speculative_config":
            parts.append(f"{value['method']} k={value['num_speculative_tokens']}")
        elif key == "attention_kernel_options":
            parts += [f"{name}={option}" for name, option in value.items()]
        elif key != "precompile":
            parts.append(f"{key}={value}")
    return ",".join(parts) or "-"


def summary(result: dict) -> str:
    parts = []
    for row in result.get("rows", []):
        if "timed" in row:
            floor = f" {row['x_floor']:.2f}x floor" if "x_floor" in row else ""
            parts.append(f"b{row['batch']} {row['timed']['output_tok_s']:.0f} tok/s{floor}")
        elif "skipped" in row:
            parts.append(f"b{row['batch']} skipped")
        elif "error" in row:
            parts.append(f"b{row['batch']} error")
    return "; ".join(parts)
