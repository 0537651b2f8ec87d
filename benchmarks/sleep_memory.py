"""Device memory around sleep mode and weight updates (docs/rl.md): live-array bytes
(``jax.live_arrays()``) and, on an accelerator, the allocator's ``bytes_in_use``, for an engine
awake, asleep at level 1, woken, asleep at level 2, and woken after ``update_weights`` (the
level-1 host copy given back as new weights); the seconds each call took, and the compiles the
generation after each wake-up took (0 expected).

    python benchmarks/sleep_memory.py [--model smollm2] [--quantization none] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxgen import LLM, SamplingParams  # noqa: E402
from jaxgen.engine.compiled.compile_counter import compile_count  # noqa: E402
from jaxgen.engine.weights import memory_in_use, named_values  # noqa: E402

PROMPTS = [list(range(5, 69)), [7, 8, 9]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


def measure(model: str | None, quantization: str, kv_cache_memory: int) -> dict:
    llm = LLM(model, quantization=quantization, kv_cache_memory=kv_cache_memory, max_model_len=256)
    first = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    stats = llm.stats()
    rows = [("awake", memory_in_use(), 0.0, None)]

    def step(label: str, call, *args):
        start = time.perf_counter()
        call(*args)
        seconds = time.perf_counter() - start
        compiles = None
        if not llm.is_sleeping():
            before = compile_count()
            again = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
            assert [o.token_ids for o in again] == [o.token_ids for o in first], label
            compiles = compile_count() - before
        rows.append((label, memory_in_use(), seconds, compiles))

    weights = jax.tree.map(np.array, named_values(llm.params))  # quantised weights too
    step("sleep(level=1)", llm.sleep, 1)
    step("wake_up()", llm.wake_up)
    step("sleep(level=2)", llm.sleep, 2)
    step("update_weights(host arrays)", llm.update_weights, weights)
    step("wake_up() after level 2", llm.wake_up)
    return {
        "model": model or "smollm2",
        "quantization": stats.get("quantization"),
        "parameter_bytes": stats["parameter_bytes"],
        "kv_pool_bytes": stats["kv_pool_bytes"],
        "rows": [
            {"state": label, **memory, "seconds": seconds, "compiles_after": compiles}
            for label, memory, seconds, compiles in rows
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2")
    parser.add_argument("--quantization", default="none")
    parser.add_argument("--kv-cache-memory", type=int, default=64 << 20)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    result = measure(args.model, args.quantization, args.kv_cache_memory)
    mib = 2**20
    print(
        f"parameter bytes {result['parameter_bytes'] / mib:.1f} MiB, KV pool {result['kv_pool_bytes'] / mib:.1f} MiB"
    )
    print("| state | live arrays (MiB) | device bytes in use (MiB) | call (s) | compiles after |")
    print("|---|---|---|---|---|")
    for row in result["rows"]:
        device = row["device_bytes_in_use"]
        device = "n/a" if device is None else f"{device / mib:.1f}"
        compiles = "" if row["compiles_after"] is None else row["compiles_after"]
        print(
            f"| {row['state']} | {row['live_array_bytes'] / mib:.1f} | {device} | "
            f"{row['seconds']:.3f} | {compiles} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
