"""The knee predicted from first principles: critical batch (compute vs weight streaming) and
how many sequences the KV pool holds.

Decoding one token per sequence reads every weight once per step whatever the batch, and does
2 FLOPs per parameter per sequence. Steps stay memory-bound, so throughput grows ~linearly with
the batch, until 2 * B * params / peak_flops exceeds params * bytes_per_param / bandwidth, i.e.

    B* ~= (peak FLOP/s / memory bytes/s) * bytes_per_param / 2

The knee is predicted at min(B*, KV-pool capacity in sequences, max_rolling_batch_size).
"""

from __future__ import annotations

import time


def critical_batch(peak_flops: float, bandwidth: float, bytes_per_param: float = 4.0) -> float:
    """B* = (FLOP/s / bytes/s) * bytes_per_param / 2."""
    if peak_flops <= 0 or bandwidth <= 0:
        raise ValueError("peak_flops and bandwidth must be > 0")
    return peak_flops / bandwidth * bytes_per_param / 2.0


def kv_capacity(kv_pool_tokens: int, tokens_per_sequence: float) -> int:
    """Sequences of ``tokens_per_sequence`` (prompt + output) the KV pool holds at once."""
    if tokens_per_sequence <= 0:
        raise ValueError("tokens_per_sequence must be > 0")
    return int(kv_pool_tokens // tokens_per_sequence)


def _best_time(fn, *args, repeats: int = 5) -> float:
    fn(*args).block_until_ready()  # compile
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return best


def measure_machine(size: int | None = None, batch: int = 512) -> dict:
    """Effective memory bandwidth (a matrix-vector product streaming a weight matrix) and
    matmul FLOP/s (the same matrix times ``batch`` columns) on the default JAX device, fp32."""
    import jax
    import jax.numpy as jnp

    if size is None:
        size = 4096 if jax.default_backend() == "cpu" else 8192
    key = jax.random.PRNGKey(0)
    weights = jax.random.normal(key, (size, size), jnp.float32)
    vector = jax.random.normal(key, (size, 1), jnp.float32)
    block = jax.random.normal(key, (size, batch), jnp.float32)
    matmul = jax.jit(jnp.matmul)
    gemv_s = _best_time(matmul, weights, vector)
    gemm_s = _best_time(matmul, weights, block)
    bandwidth = weights.nbytes / gemv_s
    flops = 2.0 * size * size * batch / gemm_s
    return {
        "measured_bandwidth_gb_s": bandwidth / 1e9,
        "measured_matmul_gflop_s": flops / 1e9,
        "critical_batch_measured": critical_batch(flops, bandwidth, 4.0),
        "roofline_matrix_size": size,
    }


def predict_knee(
    *,
    kv_pool_tokens: int | None = None,
    tokens_per_sequence: float | None = None,
    max_batch: int | None = None,
    peak_flops: float | None = None,
    bandwidth: float | None = None,
    bytes_per_param: float = 4.0,
    measured: dict | None = None,
) -> dict:
    """Each limit that is known, and the predicted knee (their minimum).

    ``peak_flops``/``bandwidth`` (datasheet numbers) win over ``measured`` (``measure_machine``).
    """
    out: dict = {}
    if peak_flops and bandwidth:
        out["critical_batch"] = critical_batch(peak_flops, bandwidth, bytes_per_param)
        out["critical_batch_source"] = "datasheet"
    elif measured:
        out["critical_batch"] = measured["critical_batch_measured"] * bytes_per_param / 4.0
        out["critical_batch_source"] = "measured matmul/matvec"
        out.update(measured)
    if kv_pool_tokens and tokens_per_sequence:
        out["kv_capacity_sequences"] = kv_capacity(kv_pool_tokens, tokens_per_sequence)
    if max_batch:
        out["max_batch"] = max_batch
    limits = [out[k] for k in ("critical_batch", "kv_capacity_sequences", "max_batch") if k in out]
    out["predicted_knee"] = min(limits) if limits else None
    return out
