"""Throughput and latency for (tensor_parallel_degree, data_parallel_size) combinations, and the
start-up time of a converted (orbax) checkpoint against the GGUF default model.

Usage:
  python benchmarks/sharding.py                 # all combos on 8 simulated CPU devices
  python benchmarks/sharding.py --quick         # fewer combos and requests
  python benchmarks/sharding.py --startup       # LLM(OUT) after `jaxgen convert` vs LLM(None)

On CPU the "devices" are XLA's simulated host devices sharing the same cores: the table shows the
mechanics (every combination runs, collectives included), not what real accelerators would do.
The model is a random-weight Llama (8 heads, 8 KV heads) so every degree up to 8 divides it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMBOS = "1x1,2x1,4x1,8x1,1x2,2x2,4x2,1x4,2x4,1x8"
QUICK_COMBOS = "1x1,2x1,8x1,2x2,1x4"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=8, help="simulated CPU devices")
    parser.add_argument("--combos", default=None, help=f"degree x replicas list (default {COMBOS})")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--startup", action="store_true", help="measure orbax vs GGUF start-up")
    return parser.parse_args()


def random_model(layers: int, hidden: int):
    """A ``LoadedModel`` with random weights and the SmolLM2 tokenizer (vocab 49152)."""
    import jax.numpy as jnp
    from flax import nnx

    from jaxgen.config import ModelConfig
    from jaxgen.loaders import LoadedModel
    from jaxgen.loaders.default_model import default_model_path
    from jaxgen.loaders.tokenizer import load_tokenizer
    from jaxgen.models import CausalLM

    gguf = default_model_path()
    tokenizer = load_tokenizer(gguf)
    config = ModelConfig(
        vocab_size=49152,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_layers=layers,
        num_heads=8,
        num_kv_heads=8,
        head_dim=hidden // 8,
        tie_word_embeddings=True,
        eos_token_ids=(tokenizer.eos_token_id,),
    )
    graphdef, params = nnx.split(CausalLM(config, dtype=jnp.float32, rngs=nnx.Rngs(0)))
    return LoadedModel(config, graphdef, params, tokenizer, "random", jnp.float32, 0.0)


def measure(loaded, degree: int, replicas: int, args: argparse.Namespace) -> dict:
    import numpy as np

    from jaxgen import LLM, SamplingParams

    llm = LLM(
        loaded,
        tensor_parallel_degree=degree,
        data_parallel_size=replicas,
        max_model_len=args.prompt_len + args.max_tokens + 16,
        kv_cache_memory=64 << 20,
        max_rolling_batch_size=32,
        max_rolling_batch_prefill_tokens=512,
    )
    rng = np.random.default_rng(0)
    warmup, prompts = (
        [rng.integers(100, 40000, args.prompt_len).tolist() for _ in range(args.requests)]
        for _ in range(2)
    )
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate(warmup, params, use_tqdm=False)  # same shapes: compiles every bucket used
    compiles = llm.stats()["compiles"]
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    ttft = [o.metrics["first_token_time"] - o.metrics["arrival_time"] for o in outs]
    e2e = [o.metrics["finish_time"] - o.metrics["arrival_time"] for o in outs]
    stats = llm.stats()
    tokens = sum(len(o.token_ids) for o in outs)
    return {
        "degree": degree,
        "replicas": replicas,
        "devices": degree * replicas,
        "tokens_per_s": tokens / wall,
        "ttft_ms": 1e3 * statistics.mean(ttft),
        "e2e_ms": 1e3 * statistics.mean(e2e),
        "wall_s": wall,
        "recompiles": stats["compiles"] - compiles,
    }


def run_combos(args: argparse.Namespace) -> None:
    import jax

    loaded = random_model(args.layers, args.hidden)
    combos = args.combos or (QUICK_COMBOS if args.quick else COMBOS)
    print(
        f"{len(jax.devices())} simulated {jax.default_backend()} devices; "
        f"{args.requests} requests x ({args.prompt_len} prompt + {args.max_tokens} generated) "
        f"tokens; {args.layers} layers, hidden {args.hidden}\n"
    )
    print("| degree | replicas | devices | tokens/s | mean TTFT ms | mean e2e ms | recompiles |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for combo in combos.split(","):
        degree, replicas = (int(x) for x in combo.split("x"))
        r = measure(loaded, degree, replicas, args)
        print(
            f"| {r['degree']} | {r['replicas']} | {r['devices']} | {r['tokens_per_s']:.0f} | "
            f"{r['ttft_ms']:.0f} | {r['e2e_ms']:.0f} | {r['recompiles']} |",
            flush=True,
        )


STARTUP_SNIPPET = """
import sys, time
start = time.perf_counter()
from jaxgen import LLM
llm = LLM(sys.argv[1] if sys.argv[1] != "-" else None, max_model_len=256,
          kv_cache_memory=64 << 20)
print(f"RESULT {time.perf_counter() - start:.2f} {llm.loaded.load_seconds:.2f}")
"""


def run_startup(args: argparse.Namespace) -> None:
    """Fresh processes: ``LLM(None)`` (GGUF: parse, dequantise, unpermute) vs ``LLM(OUT)``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    def start(model: str) -> tuple[float, float]:
        out = subprocess.run(
            [sys.executable, "-c", STARTUP_SNIPPET, model],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        line = next(x for x in out.splitlines() if x.startswith("RESULT "))
        total, load = (float(x) for x in line.split()[1:])
        return total, load

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "smollm2")
        t = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "jaxgen.cli", "convert", "smollm2", out],
            env=env,
            check=True,
            capture_output=True,
        )
        print(f"jaxgen convert smollm2: {time.perf_counter() - t:.1f} s (float32)\n")
        print("| model | run | process start -> LLM ready (s) | load_seconds |")
        print("|---|---:|---:|---:|")
        for name, model in (("GGUF default (smollm2)", "-"), ("orbax (jaxgen convert)", out)):
            for run in (1, 2):
                total, load = start(model)
                print(f"| {name} | {run} | {total:.1f} | {load:.1f} |", flush=True)


def main() -> None:
    args = parse_args()
    if args.startup:
        run_startup(args)
        return
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    os.environ["XLA_FLAGS"] = " ".join(
        flags + [f"--xla_force_host_platform_device_count={args.devices}"]
    )
    sys.path.insert(0, str(ROOT))
    run_combos(args)


if __name__ == "__main__":
    main()
