"""Stage 1, the machine: the device and software it runs, and the two ceilings every later number
is compared with: device-to-device copy bandwidth and bf16 matmul rate, measured on random data."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import time

import jax
import jax.numpy as jnp
from jax import lax

from benchmarks.gpu.floors import copy_bytes, matmul_flops, median
from benchmarks.gpu.report import command_output, log

DISTRIBUTIONS = (
    "jax",
    "jaxlib",
    "jax-cuda13-plugin",
    "jax-cuda13-pjrt",
    "jax-cuda12-plugin",
    "flax",
    "numpy",
    "transformers",
    "tokenizers",
    "torch",
    "triton",
    "llguidance",
    "gguf",
)
# What jaxgen imports at run time beyond the image's packages (the carried wheels), and the
# server's modules: importable or not, as found.
MODULES = (
    "llguidance",
    "gguf",
    "starlette",
    "uvicorn",
    "prometheus_client",
    "orbax.checkpoint",
    "jinja2",
    "safetensors",
)


def versions() -> dict:
    found = {}
    for name in DISTRIBUTIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def importable() -> dict:
    out = {}
    for name in MODULES:
        try:
            out[name] = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            out[name] = False
    return out


def nvidia_smi() -> str | None:
    """nvidia-smi's one-line view of the GPU (read only; None where there is none)."""
    query = "name,driver_version,memory.total,clocks.sm,clocks.mem,clocks.max.sm,power.limit"
    command = ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"]
    return command_output(command, timeout=20, or_stderr=True)


def timed_calls(fn, *args, repeats: int) -> list[float]:
    """Seconds of ``repeats`` calls of ``fn`` after a first (compiling) one, each synchronised."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return times


def copy_bandwidth(num_bytes: int, loops: int, repeats: int) -> dict:
    """Bytes/s of a float32 array rewritten ``loops`` times per call (x <- x + 1: one read and
    one write of every element per pass, in one XLA kernel each), and of a single copy per call
    (``jnp.copy``); the larger is the ceiling."""
    count = num_bytes // 4
    x = jax.random.normal(jax.random.key(1, impl="rbg"), (count,), jnp.float32)
    # The barrier keeps an unrolled loop's passes from fusing into one.
    looped = jax.jit(
        lambda x: lax.fori_loop(0, loops, lambda i, y: lax.optimization_barrier(y + 1.0), x)
    )
    single = jax.jit(jnp.copy)
    loop_s = median(timed_calls(looped, x, repeats=repeats))
    copy_s = median(timed_calls(single, x, repeats=repeats))
    loop_bw = copy_bytes(x.nbytes, loops) / loop_s
    copy_bw = copy_bytes(x.nbytes) / copy_s
    return {
        "bytes": x.nbytes,
        "elementwise_loop_Bps": loop_bw,
        "copy_Bps": copy_bw,
        "bandwidth_Bps": max(loop_bw, copy_bw),
        "method": "median of synchronised calls; bytes read + written",
    }


def torch_copy_bandwidth(num_bytes: int, loops: int, repeats: int) -> dict:
    """Bytes/s (read + written) of ``loops`` device-to-device copies per call through PyTorch
    (cudaMemcpy's copy engine path), timed with CUDA events: a second reading of the ceiling,
    from outside XLA. Empty when torch or its GPU is not there (the dry run)."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    src = torch.empty(num_bytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats + 1):  # the first call warms up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(loops):
            dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    seconds = median(times[1:])
    del src, dst
    torch.cuda.empty_cache()
    return {"torch_copy_Bps": copy_bytes(num_bytes // 2 * 2, loops) / seconds}


def matmul_rate(size: int, loops: int, repeats: int) -> dict:
    """bf16 FLOP/s of ``loops`` chained products x <- x @ b per call ([size]^3 each, random
    normal data, b scaled by 1/sqrt(size) so values stay near 1)."""
    a = jax.random.normal(jax.random.key(2, impl="rbg"), (size, size), jnp.bfloat16)
    b = (
        jax.random.normal(jax.random.key(3, impl="rbg"), (size, size), jnp.float32) * size**-0.5
    ).astype(jnp.bfloat16)
    chained = jax.jit(
        lambda a, b: lax.fori_loop(0, loops, lambda i, x: lax.optimization_barrier(x @ b), a)
    )
    seconds = median(timed_calls(chained, a, b, repeats=repeats))
    return {
        "size": size,
        "flops_per_s": matmul_flops(size, size, size, loops) / seconds,
        "method": f"{loops} chained bf16 products per call, median of {repeats} calls",
    }


def run(ctx, budget) -> dict:
    profile = ctx.profile
    device = jax.devices()[0]
    result = {
        "platform": device.platform,
        "device_kind": device.device_kind,
        "device_count": jax.device_count(),
        "nvidia_smi": nvidia_smi(),
        "versions": versions(),
        "importable": importable(),
        "memory": {k: v for k, v in (device.memory_stats() or {}).items() if "bytes" in k},
    }
    ctx.partial(result)
    result["copy"] = copy_bandwidth(profile.copy_bytes, profile.copy_loops, profile.repeats)
    try:
        torch_copy = torch_copy_bandwidth(profile.copy_bytes, profile.copy_loops, profile.repeats)
    except Exception as error:  # a second opinion only: its failure is recorded, not raised
        torch_copy = {"torch_copy_error": f"{type(error).__name__}: {error}"}
    result["copy"] |= torch_copy
    if torch_copy.get("torch_copy_Bps"):
        result["copy"]["bandwidth_Bps"] = max(
            result["copy"]["bandwidth_Bps"], torch_copy["torch_copy_Bps"]
        )
        result["copy"]["method"] += "; the largest of XLA's two and PyTorch's copy"
    log(f"copy bandwidth {result['copy']['bandwidth_Bps'] / 1e12:.3f} TB/s")
    ctx.partial(result)
    result["matmul"] = matmul_rate(profile.matmul_size, profile.matmul_loops, profile.repeats)
    log(f"bf16 matmul {result['matmul']['flops_per_s'] / 1e12:.1f} TFLOP/s")
    return result


def summary(result: dict) -> str:
    copy = result.get("copy", {}).get("bandwidth_Bps")
    rate = result.get("matmul", {}).get("flops_per_s")
    parts = [str(result.get("device_kind"))]
    if copy:
        parts.append(f"copy {copy / 1e12:.2f} TB/s")
    if rate:
        parts.append(f"bf16 matmul {rate / 1e12:.0f} TFLOP/s")
    missing = [name for name, ok in result.get("importable", {}).items() if not ok]
    if missing:
        parts.append("missing: " + ",".join(missing))
    return "; ".join(parts)
