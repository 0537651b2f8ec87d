"""Single-stream decode speed of the default model (one request at a time), against the
memory-bandwidth floor: each decode step must read every weight once.

    python benchmarks/single_stream.py [--model M] [--tokens 128] [--kv-cache-dtype auto|int8|fp8]
        [--temperature 0.0] [--top-p 1.0] [--quantization auto|w4a8|...]

Greedy by default; ``--temperature`` > 0 samples (seeded), through the sampler's filter stage.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np


def measure_bandwidth(size_bytes: int = 512 << 20, repeats: int = 7) -> float:
    """Device read bandwidth in bytes/s: a reduction over a buffer larger than the caches
    (what a decode step does to its weights; no output allocation to fault in)."""
    x = jax.numpy.ones(size_bytes // 4, jax.numpy.float32)
    read = jax.jit(lambda a: a.sum())
    read(x).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        read(x).block_until_ready()
        times.append(time.perf_counter() - start)
    return size_bytes / float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "int8", "fp8"))
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--quantization", default="auto", help="EngineConfig.quantization")
    args = parser.parse_args()

    from jaxgen import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(
        args.model,
        dtype=args.dtype,
        batching="none",
        max_model_len=1024,
        kv_cache_dtype=args.kv_cache_dtype,
        quantization=args.quantization,
    )
    load_s = time.perf_counter() - start
    prompt = "Write a long story about a lighthouse keeper and the ships she guides home."
    params = SamplingParams(
        max_tokens=args.tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=0,
        ignore_eos=True,
    )
    llm.generate(prompt, params, use_tqdm=False)  # warm-up: compiles every shape used below
    steps0, time0 = llm.stats()["steps"], time.perf_counter()
    llm.generate(prompt, params, use_tqdm=False)
    elapsed = time.perf_counter() - time0
    steps = llm.stats()["steps"] - steps0
    tok_s = args.tokens / elapsed
    weight_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(llm.params))
    bandwidth = measure_bandwidth()
    floor_ms = weight_bytes / bandwidth * 1e3
    print(
        f"device: {jax.devices()[0].device_kind}  devices: {jax.device_count()}  dtype: {args.dtype}"
        f"  kv_cache_dtype: {args.kv_cache_dtype}  temperature: {args.temperature}"
        f"  top_p: {args.top_p}  quantization: {args.quantization}"
    )
    print(f"load time                 {load_s:.1f} s")
    print(
        f"single-stream decode      {tok_s:.1f} tok/s  ({elapsed / steps * 1e3:.1f} ms/step, "
        f"{steps} steps incl. 1 prefill)"
    )
    print(f"read bandwidth (measured) {bandwidth / 1e9:.1f} GB/s")
    print(
        f"weight-read floor         {floor_ms:.1f} ms/token  -> {elapsed / steps * 1e3 / floor_ms:.2f}x"
    )


if __name__ == "__main__":
    main()
