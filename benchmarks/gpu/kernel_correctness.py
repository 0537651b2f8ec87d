"""Stage 2, the kernel against its float32 reference on fresh random ragged batches: shuffled
page tables; keys 1, page-1, page, page+1 and long; decode and prefill rows mixed; GQA groups 1
to 8 (3 and 7 too); head_dim 64, 96, 128, 256; bf16, float32, int8 and fp8 pools; soft cap and
sliding window; and the one-kernel split merge (``pallas_merge``), decode-only and mixed.
Device memory is filled with NaN before each call, so a row the kernel never writes shows;
padding rows must come back zero."""

from __future__ import annotations

import os
import time

import jax
import numpy as np

from benchmarks.gpu.kernel_batches import (
    CaseSpec,
    attention_kernels,
    decode_only_option,
    kernel_tuning,
    make_batch,
    poison_free_memory,
)
from benchmarks.gpu.report import log

# Largest relative error ||out - ref|| / ||ref|| that passes, by pool: bf16 operands land
# between 1e-3 and 1e-2; 8-bit pools are dequantised to bf16 (the reference reads the same
# codes); float32 may run tf32 dots (about 3e-4).
TOLERANCE = {"bfloat16": 2e-2, "int8": 2e-2, "fp8": 2e-2, "float32": 5e-3}


def cases(page_size: int, long: int, very_long: int, decode_batch: int, seed: int) -> list:
    """The checked batches; ``long`` and ``very_long`` keys, ``decode_batch`` decode rows."""
    p = page_size
    edges = (0, p - 2, p - 1, p, long - 1)  # keys 1, page-1, page, page+1, long
    rng = np.random.default_rng(seed)
    decode_contexts = tuple(int(c) for c in rng.choice([*edges, 3 * p + 5], decode_batch))
    mixed_q = (1, 1, 1, 1, 1, 37, 0, 130, 64)
    mixed_context = (*edges, 5, 20, 0, min(1000, long // 2))
    return [
        # The one-kernel split merge (pallas_merge), not yet the default: a decode-only step
        # over a long context (many splits) and a mixed step (its rows written in place).
        CaseSpec(
            "gqa4 d128 bf16 decode very long, merge kernel",
            32,
            8,
            128,
            "bfloat16",
            (1, 1, 1),
            (very_long - 1, p + 1, 0),
            decode_only=True,
            tuning=(("pallas_merge", True),),
        ),
        CaseSpec(
            "phi3 gqa3 d96 bf16 mixed, merge kernel",
            12,
            4,
            96,
            "bfloat16",
            mixed_q,
            mixed_context,
            tuning=(("pallas_merge", True), ("num_splits", 4)),
        ),
        CaseSpec("llama3 gqa4 d128 bf16 mixed", 32, 8, 128, "bfloat16", mixed_q, mixed_context),
        CaseSpec(
            "mha gqa1 d64 bf16 decode",
            8,
            8,
            64,
            "bfloat16",
            (1,) * decode_batch,
            decode_contexts,
            decode_only=True,
        ),
        CaseSpec(
            "gemma gqa8 d256 bf16 softcap window",
            16,
            2,
            256,
            "bfloat16",
            (1, 1, 1, 29, 1),
            (p, 3 * p, long - 1, 40, 0),
            soft_cap=50.0,
            sliding_window=6 * p,
        ),
        CaseSpec("phi3 gqa3 d96 bf16 mixed", 12, 4, 96, "bfloat16", mixed_q, mixed_context),
        CaseSpec("gqa4 d128 int8 mixed", 32, 8, 128, "int8", mixed_q, mixed_context),
        CaseSpec("gqa8 d128 fp8 mixed", 32, 4, 128, "fp8", mixed_q, mixed_context),
        CaseSpec("gqa2 d64 f32 mixed", 8, 4, 64, "float32", mixed_q, mixed_context),
        CaseSpec(
            "gqa4 d128 bf16 very long",
            32,
            8,
            128,
            "bfloat16",
            (1, 1, 128),
            (very_long - 1, p + 1, very_long // 2),
        ),
        CaseSpec("qwen2.5 gqa7 d128 bf16 mixed", 28, 4, 128, "bfloat16", mixed_q, mixed_context),
        CaseSpec(
            "gqa4 d64 int8 decode window",
            16,
            4,
            64,
            "int8",
            (1,) * decode_batch,
            decode_contexts,
            sliding_window=4 * p,
            decode_only=True,
        ),
    ]


def check(kernels, spec: CaseSpec, *, page_size: int, seed: int, interpret: bool) -> dict:
    batch = make_batch(spec, page_size=page_size, seed=seed)
    q = batch.args[0]
    start = time.perf_counter()
    poison_free_memory(q.shape, q.dtype)
    options = spec.options | (decode_only_option(kernels.kernel) if spec.decode_only else {})
    options |= kernel_tuning(kernels.kernel, spec.tuning)
    out = jax.block_until_ready(kernels.kernel(*batch.args, interpret=interpret, **options))
    kernel_s = time.perf_counter() - start
    reference = jax.jit(kernels.reference, static_argnames=("soft_cap", "sliding_window"))
    ref = reference(*batch.reference_args, **spec.options)
    out = np.asarray(out).astype(np.float32)
    ref = np.asarray(ref).astype(np.float32)
    real, padding = out[: batch.num_real_rows], out[batch.num_real_rows :]
    expected = ref[: batch.num_real_rows]
    non_finite = int(np.sum(~np.isfinite(real)))
    error = float(np.linalg.norm(np.nan_to_num(real - expected)) / np.linalg.norm(expected))
    padding_max = float(np.max(np.abs(np.nan_to_num(padding, nan=np.inf)), initial=0.0))
    tolerance = TOLERANCE[spec.pool]
    return {
        "case": spec.name,
        "pool": spec.pool,
        "heads": f"{spec.num_heads}/{spec.num_kv_heads}",
        "head_dim": spec.head_dim,
        "decode_only": "decode_only" in options,
        "tuning": dict(spec.tuning),
        "q_lens": list(spec.q_lens),
        "kv_lens": [q + c for q, c in zip(spec.q_lens, spec.context_lens, strict=True)],
        "relative_error": error,
        "tolerance": tolerance,
        "non_finite_real": non_finite,
        "padding_max_abs": padding_max,
        "first_call_s": kernel_s,
        "pass": non_finite == 0 and error <= tolerance and padding_max == 0.0,
    }


def run(ctx, budget) -> dict:
    profile = ctx.profile
    kernels = attention_kernels()
    seed = int.from_bytes(os.urandom(4), "little")
    page_size = ctx.page_size
    result = {"kernel_module": kernels.module, "seed": seed, "page_size": page_size, "cases": []}
    specs = cases(
        page_size, profile.long_context, profile.very_long_context, profile.decode_batch, seed
    )
    if profile.correctness_cases is not None:
        specs = [spec for spec in specs if spec.name in profile.correctness_cases]
    for index, spec in enumerate(specs):
        if not budget.allows(3.0):
            result.setdefault("skipped", []).append(spec.name)
            continue
        try:
            row = check(
                kernels, spec, page_size=page_size, seed=seed + index, interpret=profile.interpret
            )
        except Exception as error:  # one case's failure is a result, not the stage's end
            row = {"case": spec.name, "pass": False, "error": f"{type(error).__name__}: {error}"}
        log(
            f"kernel case {spec.name}: {'pass' if row['pass'] else 'FAIL'} "
            f"rel err {row.get('relative_error', float('nan')):.2e} {row.get('error', '')}"
        )
        result["cases"].append(row)
        ctx.partial(result)
    result["all_pass"] = bool(result["cases"]) and all(row["pass"] for row in result["cases"])
    if result.get("skipped"):
        result["status"] = "partial"
    return result


def summary(result: dict) -> str:
    rows = result.get("cases", [])
    passed = sum(row["pass"] for row in rows)
    errors = [row["relative_error"] for row in rows if "relative_error" in row]
    worst = f", worst rel err {max(errors):.1e}" if errors else ""
    failed = [row["case"] for row in rows if not row["pass"]]
    text = f"{passed}/{len(rows)} pass{worst} ({result.get('kernel_module')})"
    return text + (f"; FAIL: {', '.join(failed)}" if failed else "")
