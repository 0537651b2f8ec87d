"""Benchmarks paged decode attention: our GPU ragged kernel on decode steps (its decode path with
and without the MMA units), the jitted XLA reference, and jax's own
``jax.experimental.pallas.ops.gpu.paged_attention``.

Usage:
  python benchmarks/kernels.py            # GPU sweep at Llama-3-8B attention shapes, markdown table
  python benchmarks/kernels.py --quick    # tiny CPU smoke run in interpret mode (< 60 s)

Every configuration first checks each implementation against the reference, then times it over
rotated input sets (disjoint pages, so repeated calls do not hit in L2) and reports the median.
Bandwidth counts the bytes a decode step must move: K and V of every page holding a cached token,
plus q and the output. The fraction is relative to a measured device-to-device copy.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pallas_kernels import paged_attention_reference, ragged_paged_attention_gpu  # noqa: E402

ROTATION_BYTES = 256 << 20  # rotate over at least this much K/V so L2 cannot hold it


@dataclasses.dataclass(frozen=True)
class Shapes:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: jnp.dtype


LLAMA3_8B = Shapes(num_heads=32, num_kv_heads=8, head_dim=128, page_size=16, dtype=jnp.bfloat16)
QUICK = Shapes(num_heads=8, num_kv_heads=2, head_dim=64, page_size=16, dtype=jnp.bfloat16)


def make_inputs(shapes: Shapes, batch: int, context: int, max_sets: int, seed: int = 0):
    """A shared page pool and ``num_sets`` (q, lengths, block_tables) sets on disjoint pages."""
    pages_per_seq = -(-context // shapes.page_size)
    set_bytes = kv_bytes(shapes, batch, context)
    num_sets = max(1, min(max_sets, math.ceil(ROTATION_BYTES / set_bytes)))
    num_pages = num_sets * batch * pages_per_seq + 1
    pool_shape = (shapes.num_kv_heads, num_pages, shapes.page_size, shapes.head_dim)
    key_k, key_v, key_q = jax.random.split(jax.random.key(seed), 3)
    k_pages = jax.random.normal(key_k, pool_shape, shapes.dtype)
    v_pages = jax.random.normal(key_v, pool_shape, shapes.dtype)
    rng = np.random.default_rng(seed)
    sets = []
    for index, key in enumerate(jax.random.split(key_q, num_sets)):
        first = 1 + index * batch * pages_per_seq
        tables = first + rng.permutation(batch * pages_per_seq).reshape(batch, pages_per_seq)
        q = jax.random.normal(key, (batch, shapes.num_heads, shapes.head_dim), shapes.dtype)
        lengths = jnp.full((batch,), context, jnp.int32)
        sets.append((q, lengths, jnp.asarray(tables, jnp.int32)))
    return k_pages, v_pages, sets


def kv_bytes(shapes: Shapes, batch: int, context: int) -> int:
    """K plus V bytes of the pages holding ``context`` tokens for each of ``batch`` sequences."""
    pages = -(-context // shapes.page_size)
    token_bytes = shapes.num_kv_heads * shapes.head_dim * jnp.dtype(shapes.dtype).itemsize
    return 2 * batch * pages * shapes.page_size * token_bytes


def step_bytes(shapes: Shapes, batch: int, context: int) -> int:
    """Bytes one decode step must move: K/V pages read, q read, output written."""
    q_bytes = batch * shapes.num_heads * shapes.head_dim * jnp.dtype(shapes.dtype).itemsize
    return kv_bytes(shapes, batch, context) + 2 * q_bytes


def decode_step(interpret: bool, **tuning):
    """Our ragged kernel on a decode step: one query row per sequence."""

    @jax.jit
    def call(q, k_pages, v_pages, lengths, block_tables):
        batch = q.shape[0]
        cu_q_lens = jnp.arange(batch + 1, dtype=jnp.int32)
        num_seqs = jnp.asarray([batch], jnp.int32)
        args = (q, k_pages, v_pages, lengths, block_tables, cu_q_lens, num_seqs)
        return ragged_paged_attention_gpu(*args, interpret=interpret, **tuning)

    return call


def implementations(interpret: bool, page_size: int):
    """name -> fn(q, k_pages, v_pages, lengths, block_tables) for every available implementation."""
    impls = {"xla reference": jax.jit(paged_attention_reference)}
    for label, decode_dot in (("no MMA", False), ("MMA", True)):
        impls[f"pallas (ours, {label})"] = decode_step(interpret, decode_dot=decode_dot)
    try:
        from jax.experimental.pallas.ops.gpu import paged_attention as jax_ops
    except ImportError as error:  # Triton-less jaxlib builds
        print(f"skipping jax's shipped kernel: {error}")
        return impls

    @jax.jit
    def shipped(q, k_pages, v_pages, lengths, block_tables):
        # Same pool layout as ours, but (block_tables, lengths) order, no scale argument, and
        # pages_per_seq must split evenly into k_splits partitions.
        pages_per_seq = block_tables.shape[1]
        k_splits = max(d for d in range(1, 17) if pages_per_seq % d == 0)
        scaled = (q.astype(jnp.float32) * q.shape[-1] ** -0.5).astype(q.dtype)
        return jax_ops.paged_attention(
            scaled,
            k_pages,
            v_pages,
            block_tables,
            lengths,
            k_splits=k_splits,
            pages_per_compute_block=min(8, max(1, 128 // page_size)),
            interpret=interpret,
        )

    impls["jax.experimental gpu"] = shipped
    return impls


def time_call(fn, k_pages, v_pages, sets, *, reps: int, inner: int, use_do_bench: bool) -> float:
    """Median seconds per call, cycling through the rotated input sets."""
    counter = iter(range(1 << 62))

    def call_once():
        q, lengths, tables = sets[next(counter) % len(sets)]
        return fn(q, k_pages, v_pages, lengths, tables)

    jax.block_until_ready(call_once())  # compile and warm up
    if use_do_bench:
        from triton.testing import do_bench

        # do_bench times with torch CUDA events on torch's stream; blocking on each JAX result
        # makes the measurement device-synchronised regardless of stream.
        def synced():
            jax.block_until_ready(call_once())

        try:
            return do_bench(synced, return_mode="median") / 1e3
        except TypeError:  # older Triton: no return_mode
            return do_bench(synced, quantiles=[0.5])[0] / 1e3
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(inner):
            out = call_once()
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) / inner)
    return statistics.median(times)


def copy_bandwidth(num_bytes: int, reps: int) -> float:
    """Bytes per second of a jitted device-to-device elementwise copy (read + write)."""
    x = jnp.zeros((num_bytes // 4,), jnp.uint32)
    copy = jax.jit(lambda x: x + jnp.uint32(1))
    jax.block_until_ready(copy(x))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(copy(x))
        times.append(time.perf_counter() - start)
    return 2 * x.nbytes / statistics.median(times)


def max_error(fn, reference, k_pages, v_pages, inputs) -> float:
    q, lengths, tables = inputs
    expected = reference(q, k_pages, v_pages, lengths, tables).astype(jnp.float32)
    actual = fn(q, k_pages, v_pages, lengths, tables).astype(jnp.float32)
    return float(jnp.max(jnp.abs(actual - expected)))


def check_small(impls, shapes: Shapes) -> None:
    """Ragged lengths on a small pool: every implementation must match the reference."""
    k_pages, v_pages, sets = make_inputs(shapes, batch=3, context=3 * shapes.page_size, max_sets=1)
    q, _, tables = sets[0]
    lengths = jnp.asarray([1, shapes.page_size + 1, 3 * shapes.page_size], jnp.int32)
    reference = impls["xla reference"]
    for name, fn in impls.items():
        error = max_error(fn, reference, k_pages, v_pages, (q, lengths, tables))
        status = "ok" if error < 3e-2 else "MISMATCH"
        print(f"correctness {name}: max abs error {error:.2e} {status}")
        if status != "ok":
            raise SystemExit(f"{name} disagrees with the reference")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny CPU smoke run (interpret)")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions per config")
    args = parser.parse_args()

    quick = args.quick
    on_gpu = jax.default_backend() == "gpu"
    interpret = quick or not on_gpu
    shapes = QUICK if quick else LLAMA3_8B
    batches = (1, 4) if quick else (1, 8, 64, 256)
    contexts = (64, 256) if quick else (512, 2048, 8192)
    reps = args.reps or (3 if quick else 20)
    inner = 1 if quick else 10
    max_sets = 2 if quick else 256
    try:
        import torch  # noqa: F401  (do_bench needs torch's CUDA events)
        import triton.testing  # noqa: F401

        use_do_bench = on_gpu and not quick
    except ImportError:
        use_do_bench = False

    print(
        f"device: {jax.devices()[0].device_kind} ({jax.default_backend()}), interpret={interpret}"
    )
    print(f"shapes: {shapes}")
    impls = implementations(interpret, shapes.page_size)
    check_small(impls, shapes)
    bandwidth = copy_bandwidth((8 << 20) if quick else (1 << 30), reps)
    print(f"device-to-device copy bandwidth: {bandwidth / 1e9:.1f} GB/s")
    print(f"timer: {'triton.testing.do_bench' if use_do_bench else 'synchronised wall clock'}\n")

    print("| batch | context | implementation | median us | GB/s | % of copy | max abs err |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for batch in batches:
        for context in contexts:
            k_pages, v_pages, sets = make_inputs(shapes, batch, context, max_sets)
            moved = step_bytes(shapes, batch, context)
            reference = impls["xla reference"]
            for name, fn in impls.items():
                try:
                    error = max_error(fn, reference, k_pages, v_pages, sets[0])
                    seconds = time_call(
                        fn,
                        k_pages,
                        v_pages,
                        sets,
                        reps=reps,
                        inner=inner,
                        use_do_bench=use_do_bench,
                    )
                except Exception as exc:  # report and keep going (e.g. a lowering failure)
                    print(
                        f"{name} failed at batch={batch} context={context}: {exc}", file=sys.stderr
                    )
                    print(f"| {batch} | {context} | {name} | failed: {type(exc).__name__} | | | |")
                    continue
                achieved = moved / seconds
                print(
                    f"| {batch} | {context} | {name} | {seconds * 1e6:.1f} | {achieved / 1e9:.1f}"
                    f" | {100 * achieved / bandwidth:.1f} | {error:.1e} |"
                )
            del k_pages, v_pages, sets


if __name__ == "__main__":
    main()
