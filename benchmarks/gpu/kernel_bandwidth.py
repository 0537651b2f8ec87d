"""Stage 3, the kernel's achieved bandwidth on decode steps of the Llama-3-8B attention shape (32
query heads, 8 KV heads, head_dim 128, bf16, the engine's page size): batch x context as the
profile lists, against the copy bandwidth stage 1 measured. Each timed call runs the kernel
many times back to back inside one jitted loop (no host dispatch between them), each time over
a different set of pages, so neither launch overhead nor the L2 cache flatters it, and each
call's output is the next one's queries, so the loop adds no kernels of its own to the calls
(``chained_calls``). The calls are the engine's decode steps (``decode_only``: the decode
kernel and its split merge, no prefill kernel). The kernel's decode variants and split counts
(``tuning_variants``) are timed at a few pairs."""

from __future__ import annotations

import functools
import itertools
import time

import jax
from jax import lax

from benchmarks.gpu.floors import DecodeAttention, median
from benchmarks.gpu.kernel_batches import (
    attention_kernels,
    decode_batch,
    decode_only_option,
    tuning_variants,
    variant_tunings,
)
from benchmarks.gpu.kernel_trace import traced_kernel_times
from benchmarks.gpu.report import log

# Bandwidth assumed before the first timing, to size the loop of kernel calls per timed call.
GUESS_BPS = 3e12
# Issue 40's target: at least this share of the copy bandwidth at these (batch, context).
TARGET_FRACTION = 0.75
TARGET_CONFIGS = ((64, 4096), (1, 32768))
# Block tables rotated over at most (each a call of the unrolled round, ``chained_calls``): 16
# keep the round's compile short and span 67 MB of K/V at the smallest shape (1 x 1k), more
# than an H100's or H200's 50 MB L2.
MAX_ROTATIONS = 16


def loop_count(num_bytes: int, seconds: float, max_loops: int) -> int:
    """Kernel calls per timed call: about ``seconds`` of work at GUESS_BPS, within [2, max]."""
    return int(min(max_loops, max(2, seconds * GUESS_BPS / max(num_bytes, 1))))


def chained_calls(call, rounds: int):
    """A jitted function of ``(q, k_pages, v_pages, kv_lens, tables, cu_q_lens, num_seqs)``,
    ``tables`` a tuple of R block tables: ``rounds`` times over, one call per table in turn,
    each call's output the next call's query rows (the same shape and dtype), so no output is
    dropped and nothing but the attention calls runs: no per-call slicing of the tables (the R
    calls of a round are unrolled), no reduction of the outputs, and the loop's counter and its
    test once per round."""

    @jax.jit
    def many(q, k_pages, v_pages, kv_lens, tables, cu_q_lens, num_seqs):
        def one_round(_, q):
            for table in tables:
                q = call(q, k_pages, v_pages, kv_lens, table, cu_q_lens, num_seqs)
            return q

        return lax.fori_loop(0, rounds, one_round, q)

    return many


def time_config(
    kernels, batch_args, *, loops: int, repeats: int, interpret: bool, tuning, trace: bool = False
):
    """``(median seconds of one kernel call, seconds of the first (compiling) call, the traced
    times, kernel calls per timed call)``: at least ``loops`` calls per jitted call
    (``chained_calls``, the block tables rotating); with ``trace``, also one more jitted call
    under the profiler (``traced_kernel_times``: the device's busy time per kernel call)."""
    q, k_pages, v_pages, kv_lens, tables, cu_q_lens, num_seqs = batch_args
    # A decode step of the engine: one row per sequence slot, every row a decode row.
    options = decode_only_option(kernels.kernel)
    call = functools.partial(kernels.kernel, interpret=interpret, **options, **tuning)
    rotations = tables.shape[0]
    rounds = max(1, -(-loops // rotations))
    many = chained_calls(call, rounds)
    args = (q, k_pages, v_pages, kv_lens, tuple(tables), cu_q_lens, num_seqs)
    calls = rounds * rotations

    start = time.perf_counter()
    jax.block_until_ready(many(*args))
    first_s = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(many(*args))
        times.append(time.perf_counter() - start)
    traced = {}
    if trace:
        traced = traced_kernel_times(lambda: jax.block_until_ready(many(*args)), calls)
    return median(times) / calls, first_s, traced, calls


def run(ctx, budget) -> dict:
    profile = ctx.profile
    kernels = attention_kernels()
    num_heads, num_kv_heads, head_dim = profile.bandwidth_heads
    page_size = ctx.page_size
    copy_bw = ctx.copy_bandwidth()
    variants = tuning_variants(kernels.kernel, ctx.args.kernel_tuning)
    result = {
        "kernel_module": kernels.module,
        "shape": {"num_heads": num_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim},
        "page_size": page_size,
        "copy_bandwidth_Bps": copy_bw,
        "variants_tried": variants,
        "rows": [],
    }
    plan = [(b, c, {}) for b, c in profile.bandwidth_configs]
    variant_configs = ctx.args.variant_configs or profile.variant_configs
    for (batch, context), tuning in itertools.product(
        variant_configs, variant_tunings(variants, profile.variant_values)
    ):
        plan.append((batch, context, tuning))
    for batch, context, tuning in plan:
        if not budget.allows(4.0):
            result.setdefault("skipped", []).append([batch, context, tuning])
            continue
        shape = DecodeAttention(batch, context, num_heads, num_kv_heads, head_dim, page_size)
        num_bytes, kv_bytes = shape.bytes_moved(itemsize=2), shape.kv_bytes(itemsize=2)
        rotations = int(min(MAX_ROTATIONS, max(1, -(-profile.rotation_bytes // kv_bytes))))
        row = {"batch": batch, "context": context, "tuning": tuning, "bytes": num_bytes}
        try:
            args = decode_batch(shape, rotations=rotations)
            loops = loop_count(num_bytes, profile.seconds_per_call, profile.max_loops)
            seconds, first_s, traced, calls = time_config(
                kernels,
                args,
                loops=loops,
                repeats=profile.repeats,
                interpret=profile.interpret,
                tuning=tuning,
                trace=profile.trace_kernels,
            )
            del args
            achieved = num_bytes / seconds
            row |= {
                "us_per_call": seconds * 1e6,
                "achieved_Bps": achieved,
                "fraction_of_copy": achieved / copy_bw if copy_bw else None,
                "rotations": rotations,
                "loops": calls,
                "compile_and_first_s": first_s,
            }
            row |= traced
            device_us = traced.get("device_busy_us_per_call")
            if device_us:
                row["device_achieved_Bps"] = num_bytes / (device_us * 1e-6)
                if copy_bw:
                    row["device_fraction_of_copy"] = row["device_achieved_Bps"] / copy_bw
            if copy_bw and not tuning and (batch, context) in TARGET_CONFIGS:
                row["meets_target"] = achieved / copy_bw >= TARGET_FRACTION
            fraction = f" ({achieved / copy_bw:.0%} of copy)" if copy_bw else ""
            device = f"; device {device_us:.1f} us" if device_us else ""
            log(
                f"attention b{batch} ctx{context} {tuning or 'default'}: "
                f"{seconds * 1e6:.1f} us, {achieved / 1e12:.3f} TB/s{fraction}{device}"
            )
            for kernel in traced.get("kernels", [])[:4]:
                log(
                    f"  {kernel['us_per_call']:8.2f} us x{kernel['launches_per_call']:.2f} "
                    f"{kernel['name'][:80]}"
                )
        except Exception as error:
            row["error"] = f"{type(error).__name__}: {error}"
            log(f"attention b{batch} ctx{context} {tuning}: {row['error']}")
        result["rows"].append(row)
        ctx.partial(result)
    if result.get("skipped"):
        result["status"] = "partial"
    return result


def summary(result: dict) -> str:
    parts = []
    for row in result.get("rows", []):
        if row["tuning"] or "achieved_Bps" not in row:
            continue
        if (row["batch"], row["context"]) in ((64, 4096), (1, 32768), (1, 1024)):
            fraction = row.get("fraction_of_copy")
            share = f" {fraction:.0%}" if fraction else ""
            parts.append(
                f"b{row['batch']}x{row['context']}: {row['achieved_Bps'] / 1e12:.2f} TB/s{share}"
            )
    errors = sum("error" in row for row in result.get("rows", []))
    return "; ".join(parts) + (f"; {errors} errors" if errors else "")


def table_rows(result: dict) -> list[dict]:
    rows = []
    for row in result.get("rows", []):
        rows.append(
            {
                "batch": row["batch"],
                "context": row["context"],
                "tuning": ",".join(f"{k}={v}" for k, v in row["tuning"].items()) or "default",
                "us": row.get("us_per_call"),
                "TB/s": row["achieved_Bps"] / 1e12 if "achieved_Bps" in row else None,
                "of copy": row.get("fraction_of_copy"),
                "device us": row.get("device_busy_us_per_call"),
                "device of copy": row.get("device_fraction_of_copy"),
                "error": row.get("error"),
            }
        )
    return rows
