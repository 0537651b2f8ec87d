"""Quantised weights against float32 on the default model, in one run: single-stream decode
(batch 1, 128 new tokens), batched chat (64 prompts x 64 tokens), parameter bytes and KV bytes
per token; llama.cpp's llama-bench on the same GGUF (2 threads, one run after each repeat of the
single streams) when a binary is found.

    python benchmarks/quantized_weights.py [--repeats 3] [--llama-bench PATH] [--json out.json]
        [--skip-batched] [--async-scheduling] [--num-scheduler-steps N]

Variants: ``float32`` (the GGUF dequantised, ``quantization="none"``), ``int8`` (quantised at
load from it: int8 groups of 32, as Q8_0), ``w8a8`` (the same int8 weights, and every matmul
quantises its input to int8: ``quantization="w8a8"``), ``int4-gguf`` (the file's Q4_1 / Q8_0
kept, ``quantization="auto"``) and ``int4-gguf-w4a8`` (kept, with int8 activations as llama.cpp
computes them: ``quantization="w4a8"``). Single-stream and batched runs are interleaved across variants, best
of ``--repeats``, all warm, so load from other processes hits each variant alike.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import subprocess
import time

VARIANTS = {
    "float32": "none",
    "int8": "int8",
    "w8a8": "w8a8",
    "int4-gguf": "auto",
    "int4-gguf-w4a8": "w4a8",
}


def chat_prompts(count: int) -> list[list[dict]]:
    topics = ["the sea", "trains", "bread", "volcanoes", "chess", "owls", "rain", "bridges"]
    asks = ["Write a short poem about", "Explain in two sentences", "List three facts about",
            "Tell a tiny story about", "Why do people like", "Describe", "Give advice about",
            "What is surprising about"]  # fmt: skip
    return [
        [
            {
                "role": "user",
                "content": f"{asks[i % len(asks)]} {topics[i // len(asks) % len(topics)]}.",
            }
        ]
        for i in range(count)
    ]


def single_stream(llm, tokens: int) -> float:
    from jaxgen import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    start = time.perf_counter()
    out = llm.chat(chat_prompts(1)[0], params, use_tqdm=False)
    return len(out[0].outputs[0].token_ids) / (time.perf_counter() - start)


def batched(llm, prompts: int, tokens: int) -> float:
    from jaxgen import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.chat(chat_prompts(prompts), params, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - start)


def llama_bench(binary: str, model: str, tokens: int) -> float | None:
    """llama.cpp's decode tok/s for ``tokens`` new tokens, 2 threads, one stream, one run."""
    command = [
        binary,
        "-m",
        model,
        "-p",
        "0",
        "-n",
        str(tokens),
        "-t",
        "2",
        "-r",
        "1",
        "-o",
        "json",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        print(f"llama-bench failed: {done.stderr[-500:]}")
        return None
    return float(json.loads(done.stdout)[0]["avg_ts"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--batch-prompts", type=int, default=64)
    parser.add_argument("--batch-tokens", type=int, default=64)
    parser.add_argument("--llama-bench", default=None, help="llama-bench binary (default: search)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--skip-batched", action="store_true", help="single stream and bytes only")
    parser.add_argument(
        "--async-scheduling", action="store_true", help="every engine schedules a step ahead"
    )
    parser.add_argument(
        "--num-scheduler-steps",
        type=int,
        default=1,
        help="every engine runs this many decode steps per call (multi-step decoding)",
    )
    args = parser.parse_args()

    from jaxgen import LLM
    from jaxgen.loaders import load_model
    from jaxgen.loaders.default_model import default_model_path
    from jaxgen.quantization.stats import weight_stats

    engines, rows = {}, {}
    for name, quantization in VARIANTS.items():
        loaded = load_model(None, quantization=quantization)
        llm = LLM(
            loaded,
            max_model_len=512,
            kv_cache_memory=512 << 20,
            precompile=not args.skip_batched,
            async_scheduling=args.async_scheduling,
            num_scheduler_steps=args.num_scheduler_steps,
        )
        engines[name] = llm
        stats = llm.stats()
        rows[name] = {
            "parameter_bytes": weight_stats(loaded)["parameter_bytes"],
            "weight_dtypes": weight_stats(loaded)["weight_dtypes"],
            "kv_bytes_per_token": stats["kv_bytes_per_token"],
            "single_stream_tok_s": 0.0,
        }
        single_stream(llm, 8)  # warm
    binary = args.llama_bench or next(
        iter(
            sorted(glob.glob("/tmp/lcpp/llama_cpp_python-*/vendor/llama.cpp/build/bin/llama-bench"))
        ),
        None,
    )
    llama_cpp = None
    # Repeats interleave the variants and llama.cpp, best of each: load from other processes
    # and the VM's drift hit them alike.
    for _ in range(args.repeats):
        for name, llm in engines.items():
            speed = single_stream(llm, args.tokens)
            rows[name]["single_stream_tok_s"] = max(rows[name]["single_stream_tok_s"], speed)
        if binary:
            run = llama_bench(binary, default_model_path(), args.tokens)
            llama_cpp = max(llama_cpp or 0.0, run or 0.0) or None
    for name, llm in engines.items():
        rows[name]["batched_tok_s"] = float("nan") if args.skip_batched else 0.0
        if not args.skip_batched:
            batched(llm, args.batch_prompts, 4)  # warm the batch shapes
    for _ in range(0 if args.skip_batched else args.repeats):  # interleaved too, best of each
        for name, llm in engines.items():
            speed = batched(llm, args.batch_prompts, args.batch_tokens)
            rows[name]["batched_tok_s"] = max(rows[name]["batched_tok_s"], speed)

    base = rows["float32"]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs")
    print("| weights | single stream tok/s | x float32 | batched tok/s | x float32 | "
          "parameter MB | x float32 | KV bytes/token |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, row in rows.items():
        print(
            f"| {name} | {row['single_stream_tok_s']:.1f} | "
            f"{row['single_stream_tok_s'] / base['single_stream_tok_s']:.2f} | "
            f"{row['batched_tok_s']:.1f} | {row['batched_tok_s'] / base['batched_tok_s']:.2f} | "
            f"{row['parameter_bytes'] / 1e6:.1f} | "
            f"{row['parameter_bytes'] / base['parameter_bytes']:.3f} | "
            f"{row['kv_bytes_per_token']} |"
        )
    if llama_cpp:
        int4 = rows["int4-gguf"]["single_stream_tok_s"]
        print(f"llama.cpp (llama-bench, 2 threads, {args.tokens} tokens): {llama_cpp:.1f} tok/s; "
              f"int4-gguf / llama.cpp = {int4 / llama_cpp:.2f}")  # fmt: skip
    else:
        print("llama.cpp: no llama-bench binary found (../shared/tools/build_llamacpp.sh)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "llama_cpp_tok_s": llama_cpp}, f, indent=2)


if __name__ == "__main__":
    main()
