"""XLA:CPU's dot against the native CPU matmul kernel at the default model's projection shapes.

Usage: python benchmarks/matmul_cpu.py [--rows 1,8,32,64,128,512] [--seconds 1.0]

For every row count (tokens in a step) and every projection shape of SmolLM2-135M (q/o 576x576,
k/v 576x192, gate/up 576x1536, down 1536x576) plus an LM-head-sized 576x49152, it checks the
kernel (weights packed beforehand, as the engine does once at start) against jnp.dot, then times
both jitted and prints GFLOP/s and the kernel's speed-up. Each weight set is rotated over copies totalling at least 64 MB so that
neither side reads its weights from cache more than a real step would.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxgen.backends.cpu_kernels import (  # noqa: E402
    matmul_cpu,
    matmul_kernel_available,
    pack_weight,
)

SHAPES = {  # name: (depth, columns)
    "q/o 576x576": (576, 576),
    "k/v 576x192": (576, 192),
    "gate/up 576x1536": (576, 1536),
    "down 1536x576": (1536, 576),
    "576x49152": (576, 49152),
}
ROTATION_BYTES = 64 << 20


def _time(fn, x, weights, seconds: float) -> float:
    """Median seconds per call over rotated weights."""
    jax.block_until_ready(fn(x, weights[0]))
    samples, start, i = [], time.perf_counter(), 0
    while time.perf_counter() - start < seconds or len(samples) < 5:
        t0 = time.perf_counter()
        jax.block_until_ready(fn(x, weights[i % len(weights)]))
        samples.append(time.perf_counter() - t0)
        i += 1
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8,32,64,128,512")
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    if not matmul_kernel_available():
        sys.exit("the CPU matmul kernel is not available on this machine")
    rng = np.random.default_rng(0)
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}")
    print("| rows | weight | XLA dot GFLOP/s | kernel GFLOP/s | kernel speed-up |")
    print("|---:|---|---:|---:|---:|")
    for name, (depth, columns) in SHAPES.items():
        copies = max(1, ROTATION_BYTES // (4 * depth * columns))
        shape = (depth, columns)
        weights = [jnp.asarray(rng.standard_normal(shape), jnp.float32) for _ in range(copies)]
        packed = [pack_weight(w) for w in weights]
        xla = jax.jit(jnp.dot)
        kernel = jax.jit(matmul_cpu)
        for rows in (int(r) for r in args.rows.split(",")):
            x = jnp.asarray(rng.standard_normal((rows, depth)), jnp.float32)
            np.testing.assert_allclose(
                np.asarray(kernel(x, packed[0])), np.asarray(xla(x, weights[0])), atol=1e-3
            )
            flops = 2 * rows * depth * columns
            t_xla = _time(xla, x, weights, args.seconds)
            t_kernel = _time(kernel, x, packed, args.seconds)
            print(
                f"| {rows} | {name} | {flops / t_xla / 1e9:.1f} | {flops / t_kernel / 1e9:.1f} "
                f"| {t_xla / t_kernel:.2f}x |"
            )


if __name__ == "__main__":
    main()
