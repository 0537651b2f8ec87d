"""Stage 4, the decode step's matmuls alone: the Llama-3-8B projections (QKV, output, gate or up,
down) at the rows of a batch-1 and a batch-64 decode step, as XLA compiles them by default (its
autotuned Triton GEMM fusions: pallas-gpu's ``xla_gemm="triton"``) and with cuBLAS
(``xla_gemm="cublas"``), against the copy bandwidth. The engine's traces put the small
projections' Triton GEMMs well below the weight-read ceiling (docs/gpu.md), so each
configuration is timed with the weights cold: a timed call runs many products back to back in
one jitted loop, rotating over copies of the weight that together exceed the L2 several times,
each product's input the previous one's (its first column added back in), so no product is
hoisted, merged or dropped. The profiler trace of one more call parts the products' kernels
from those adds. And QKV as the engine's step has it (``qkv_3``): three weights sharing their
input, which XLA's dot merger joins into one Triton GEMM reading the three where they lie,
against the same three products unmerged (three GEMMs): beside the ``qkv`` rows (one
[4096, 6144] matrix), whether the merged GEMM or a weight stored fused would read faster."""

from __future__ import annotations

import functools
import itertools
import time

import jax
import jax.numpy as jnp
from jax import lax

from benchmarks.gpu.floors import median
from benchmarks.gpu.kernel_bandwidth import loop_count
from benchmarks.gpu.kernel_trace import traced_kernel_times
from benchmarks.gpu.report import log
from jaxgen.backends.pallas_gpu import XLA_GEMMS

# XLA's own kernels beside the products (the adds that chain them, copies): named by XLA's
# fusion kinds; a GEMM is "gemm_fusion..." (Triton) or cuBLAS's own name.
HELPER_PREFIXES = ("loop_", "input_", "wrapped_", "fusion", "Memcpy", "memcpy")
# Copies of a weight rotated over at most (the 8B's smallest, 32 MiB, fills 512 MiB with 16).
MAX_COPIES = 16
# The next input is the last one plus this times the product's first column: small enough that
# the values stay finite over thousands of products.
CHAIN_SCALE = 1e-3
# The QKV products as the step runs them: XLA's default (the dot merger joins them) and unmerged.
MERGED_QKV_VARIANTS = {"triton": None, "triton-unmerged": {"xla_gpu_dot_merger_threshold_mb": 0}}


def linear_shapes(model: dict) -> list[tuple[str, int, int]]:
    """``(name, in features, out features)`` of a decoder layer's matmuls (the engine runs the
    gate and up projections as two products of the same shape)."""
    hidden, inter = model["hidden_size"], model["intermediate_size"]
    heads, kv_heads = model["num_attention_heads"], model["num_key_value_heads"]
    head_dim = model.get("head_dim") or hidden // heads
    return [
        ("qkv", hidden, (heads + 2 * kv_heads) * head_dim),
        ("o", heads * head_dim, hidden),
        ("gate_up", hidden, inter),
        ("down", inter, hidden),
    ]


def timed_products(model: dict) -> list[tuple[str, int, tuple[int, ...], dict]]:
    """``(name, in features, each weight's out features, variants)``: every matmul of
    :func:`linear_shapes` alone under ``XLA_GEMMS``, and after QKV as one matrix, QKV as three
    weights sharing their input (``MERGED_QKV_VARIANTS``)."""
    hidden = model["hidden_size"]
    heads, kv_heads = model["num_attention_heads"], model["num_key_value_heads"]
    head_dim = model.get("head_dim") or hidden // heads
    products = [(name, k, (n,), XLA_GEMMS) for name, k, n in linear_shapes(model)]
    split = ("qkv_3", hidden, (heads * head_dim, kv_heads * head_dim, kv_heads * head_dim))
    return [products[0], (*split, MERGED_QKV_VARIANTS), *products[1:]]


def chained_products(rounds: int, compiler_options: dict | None):
    """A jitted ``(x [M, K], groups: tuple of tuples of [K, N]) -> x``: ``rounds`` times over,
    one group in turn, each of its weights multiplying the same input, and the next input
    ``x + CHAIN_SCALE * (the products' first columns summed)``."""

    @functools.partial(jax.jit, compiler_options=compiler_options)
    def many(x, groups):
        def one_round(_, x):
            for group in groups:
                column = sum(((x @ weight)[:, :1] for weight in group[1:]), (x @ group[0])[:, :1])
                x = x + (CHAIN_SCALE * column).astype(x.dtype)  # [M, K]
            return x

        return lax.fori_loop(0, rounds, one_round, x)

    return many


def gemm_device_us(traced: dict) -> float | None:
    """The products' own device time per call: the busy time less XLA's helper kernels."""
    busy = traced.get("device_busy_us_per_call")
    if busy is None:
        return None
    helpers = sum(
        kernel["us_per_call"]
        for kernel in traced.get("kernels", [])
        if kernel["name"].startswith(HELPER_PREFIXES)
    )
    return busy - helpers


def time_products(x, weights, *, rounds: int, options, repeats: int, trace: bool) -> dict:
    """Wall seconds per product group (median of ``repeats`` timed calls), the first call's
    seconds, and (with ``trace``) the traced device times per group."""
    many = chained_products(rounds, options)
    calls = rounds * len(weights)
    start = time.perf_counter()
    jax.block_until_ready(many(x, weights))
    first_s = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(many(x, weights))
        times.append(time.perf_counter() - start)
    traced = {}
    if trace:
        traced = traced_kernel_times(lambda: jax.block_until_ready(many(x, weights)), calls)
    return {"seconds": median(times) / calls, "first_s": first_s, "calls": calls, **traced}


def random_weights(key, count: int, k: int, widths: tuple[int, ...]) -> tuple:
    """``count`` groups of bf16 weights ``[k, n]`` (one per ``widths``) of variance 1 / k."""
    keys = jax.random.split(key, count * len(widths)).reshape(count, len(widths))
    return tuple(
        tuple(
            (jax.random.normal(key, (k, n), jnp.float32) * k**-0.5).astype(jnp.bfloat16)
            for key, n in zip(group, widths, strict=True)
        )
        for group in keys
    )


def run(ctx, budget) -> dict:
    profile = ctx.profile
    copy_bw = ctx.copy_bandwidth()
    result = {
        "copy_bandwidth_Bps": copy_bw,
        "variants": {**XLA_GEMMS, **MERGED_QKV_VARIANTS},
        "rows": [],
    }
    key = jax.random.key(0)
    for name, k, widths, variants in timed_products(profile.model):
        n = sum(widths)
        weight_bytes = k * n * 2
        copies = int(min(MAX_COPIES, max(1, -(-profile.rotation_bytes // weight_bytes))))
        weights = None
        for rows, variant in itertools.product(profile.gemm_rows, variants):
            row = {"name": name, "rows": rows, "k": k, "n": n, "variant": variant}
            if len(widths) > 1:
                row["widths"] = list(widths)
            if not budget.allows(3.0):
                result.setdefault("skipped", []).append(row)
                continue
            try:
                if weights is None:
                    key, weights_key = jax.random.split(key)
                    weights = random_weights(weights_key, copies, k, widths)
                x = jax.random.normal(jax.random.fold_in(key, rows), (rows, k), jnp.bfloat16)
                num_bytes = weight_bytes + 2 * rows * (k + n)
                calls = loop_count(num_bytes, profile.gemm_seconds, profile.max_loops)
                timed = time_products(
                    x,
                    weights,
                    rounds=max(1, -(-calls // copies)),
                    options=variants[variant],
                    repeats=profile.repeats,
                    trace=profile.trace_kernels,
                )
                row |= {"bytes": num_bytes, "copies": copies, **timed}
                row["us_per_call"] = timed["seconds"] * 1e6
                row["achieved_Bps"] = num_bytes / timed["seconds"]
                gemm_us = gemm_device_us(timed)
                if gemm_us:
                    row["gemm_device_us_per_call"] = gemm_us
                    row["gemm_achieved_Bps"] = num_bytes / (gemm_us * 1e-6)
                if copy_bw:
                    row["fraction_of_copy"] = row["achieved_Bps"] / copy_bw
                    if gemm_us:
                        row["gemm_fraction_of_copy"] = row["gemm_achieved_Bps"] / copy_bw
                device = f"; products {gemm_us:.1f} us on the device" if gemm_us else ""
                log(
                    f"gemm {name} {rows}x{k}x{n} {variant}: {row['us_per_call']:.1f} us, "
                    f"{row['achieved_Bps'] / 1e12:.3f} TB/s{device}"
                )
                for kernel in timed.get("kernels", [])[:3]:
                    log(f"  {kernel['us_per_call']:8.2f} us {kernel['name'][:80]}")
            except Exception as error:
                row["error"] = f"{type(error).__name__}: {error}"
                log(f"gemm {name} {rows} {variant}: {row['error']}")
            result["rows"].append(row)
            ctx.partial(result)
        del weights
    if result.get("skipped"):
        result["status"] = "partial"
    return result


def summary(result: dict) -> str:
    """The products' share of the copy bandwidth, per rows and variant: ``M2 triton: qkv 71%
    o 65% ...``."""
    groups: dict[str, list[str]] = {}
    for row in result.get("rows", []):
        share = row.get("gemm_fraction_of_copy") or row.get("fraction_of_copy")
        if share is not None:
            group = groups.setdefault(f"M{row['rows']} {row['variant']}", [])
            group.append(f"{row['name']} {share:.0%}")
    errors = sum("error" in row for row in result.get("rows", []))
    text = "; ".join(f"{group}: {' '.join(parts)}" for group, parts in groups.items())
    return text + (f"; {errors} errors" if errors else "")


def table_rows(result: dict) -> list[dict]:
    return [
        {
            "matmul": f"{row['name']} {row['rows']}x{row['k']}x{row['n']}",
            "variant": row["variant"],
            "us": row.get("us_per_call"),
            "of copy": row.get("fraction_of_copy"),
            "device us": row.get("gemm_device_us_per_call"),
            "device of copy": row.get("gemm_fraction_of_copy"),
            "kernel": (row.get("kernels") or [{"name": "-"}])[0]["name"][:40],
            "error": row.get("error"),
        }
        for row in result.get("rows", [])
    ]
