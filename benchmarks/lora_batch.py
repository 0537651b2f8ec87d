"""Multi-LoRA's cost on the CPU, default model: one batch of 32 requests over 4 random rank-8
adapters (every projection targeted) against the same batch with no adapter (an engine without
LoRA, and the LoRA engine's requests without one), best of ``--repeats``, warm, interleaved;
and the compiles a first adapter, a switch and a mix take (none expected after warm-up).

    python benchmarks/lora_batch.py [--requests 32] [--adapters 4] [--rank 8] [--tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time

import numpy as np

from jaxgen import LLM, SamplingParams
from jaxgen.layers.lora import lora_targets
from jaxgen.loaders import load_model
from jaxgen.lora import LoRARequest


def write_adapter(path: str, targets: dict, rank: int, seed: int) -> str:
    """A random PEFT adapter (adapter_config.json + adapter_model.safetensors) of ``targets``."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    tensors = {}
    for target, (n_in, n_out) in targets.items():
        name = f"base_model.model.model.{target}"
        tensors[f"{name}.lora_A.weight"] = rng.normal(0, 0.02, (rank, n_in)).astype(np.float32)
        tensors[f"{name}.lora_B.weight"] = rng.normal(0, 0.02, (n_out, rank)).astype(np.float32)
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    modules = sorted({t.rsplit(".", 1)[1] for t in targets})
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": modules}
    with open(os.path.join(path, "adapter_config.json"), "w") as handle:
        json.dump(config, handle)
    return path


def timed(llm, prompts, params, loras) -> float:
    start = time.perf_counter()
    llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    loaded = load_model(None)
    root = tempfile.mkdtemp(prefix="lora-bench-")
    targets = lora_targets(loaded.params)
    loras = [
        LoRARequest(f"a{i}", i + 1, write_adapter(f"{root}/a{i}", targets, args.rank, i))
        for i in range(args.adapters)
    ]
    rng = np.random.default_rng(0)
    vocab = loaded.config.vocab_size
    prompts = [rng.integers(100, vocab, args.prompt_tokens).tolist() for _ in range(args.requests)]
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    mixed = [loras[i % args.adapters] for i in range(args.requests)]
    knobs = dict(max_rolling_batch_size=args.requests, precompile=True)
    base = LLM(loaded, **knobs)
    lora = LLM(loaded, enable_lora=True, max_loras=args.adapters, max_lora_rank=args.rank, **knobs)
    compiles = lora.stats()["compiles"]
    timed(lora, prompts[:4], params, loras[0])  # a first adapter
    timed(lora, prompts[:4], params, loras[1])  # a switch
    new_compiles = lora.stats()["compiles"] - compiles
    runs = {"no LoRA engine": [], "LoRA engine, no adapter": [], "LoRA engine, 4 adapters": []}
    timed(base, prompts, params, None)
    timed(lora, prompts, params, mixed)
    compiles = lora.stats()["compiles"]
    for _ in range(args.repeats):
        runs["no LoRA engine"].append(timed(base, prompts, params, None))
        runs["LoRA engine, no adapter"].append(timed(lora, prompts, params, None))
        runs["LoRA engine, 4 adapters"].append(timed(lora, prompts, params, mixed))
    new_compiles += lora.stats()["compiles"] - compiles
    tokens = args.requests * args.tokens
    best = {name: min(times) for name, times in runs.items()}
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    print(f"{args.requests} requests x {args.tokens} tokens, rank {args.rank}")
    for name, seconds in best.items():
        print(f"{name:26s} {seconds:7.2f} s  {tokens / seconds:7.1f} tok/s")
    ratio = best["no LoRA engine"] / best["LoRA engine, 4 adapters"]
    print(f"throughput ratio, 4 adapters / no LoRA engine: {ratio:.2f}x")
    print(f"compiles after warm-up (first adapter, switch, mixed runs): {new_compiles}")


if __name__ == "__main__":
    main()
