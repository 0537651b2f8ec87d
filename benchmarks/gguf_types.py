"""Every GGUF quantisation type kept, on the CPU: per file, jaxgen's decode speed with the file's
weights kept (``quantization="auto"``) in one stream and at 16 sequences, its parameter bytes
against the file's, and llama.cpp on the same file (``llama-bench`` for one stream,
``llama-batched-bench`` for 16), interleaved, best of ``--repeats``, all warm.

    cd benchmarks && python gguf_types.py FILE.gguf [FILE.gguf ...] [--repeats 2] [--json OUT]

The files: the default model requantised by llama.cpp's own ``llama-quantize`` into each type
(``python gguf_quantized_files.py``, which writes them).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import subprocess

from quantized_weights import batched, llama_bench, single_stream


def llama_bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/tmp/lcpp/llama_cpp_python-*/vendor/llama.cpp/build/bin/{name}"))
    return found[0] if found else None


def llama_batched(binary: str, model: str, sequences: int, tokens: int) -> float | None:
    """llama.cpp's generation tok/s over ``sequences`` parallel streams of ``tokens`` tokens
    after a 32-token prompt each, 2 threads."""
    command = [binary, "-m", model, "-c", str(sequences * (tokens + 64)), "-b", "2048",
               "-ub", "512", "-npp", "32", "-ntg", str(tokens), "-npl", str(sequences),
               "-t", "2", "--output-format", "jsonl"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        print(f"llama-batched-bench failed: {done.stderr[-500:]}")
        return None
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return float(rows[-1]["speed_tg"]) if rows else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("files", nargs="+")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--batch-tokens", type=int, default=64)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from jaxgen import LLM
    from jaxgen.loaders import load_model
    from jaxgen.quantization.stats import weight_stats

    bench, batched_bench = llama_bin("llama-bench"), llama_bin("llama-batched-bench")
    rows = {}
    for path in args.files:
        loaded = load_model(path, quantization="auto")
        stats = weight_stats(loaded)
        llm = LLM(loaded, max_model_len=512, kv_cache_memory=512 << 20, precompile=True)
        single_stream(llm, 8)
        batched(llm, args.sequences, 4)
        row = {"file_bytes": os.path.getsize(path), "parameter_bytes": stats["parameter_bytes"],
               "weight_dtypes": stats["weight_dtypes"], "single": 0.0, "batched": 0.0,
               "llama_single": None, "llama_batched": None}  # fmt: skip
        for _ in range(args.repeats):
            row["single"] = max(row["single"], single_stream(llm, args.tokens))
            row["batched"] = max(row["batched"], batched(llm, args.sequences, args.batch_tokens))
            if bench:
                speed = llama_bench(bench, path, args.tokens)
                row["llama_single"] = max(row["llama_single"] or 0.0, speed or 0.0) or None
            if batched_bench:
                speed = llama_batched(batched_bench, path, args.sequences, args.batch_tokens)
                row["llama_batched"] = max(row["llama_batched"] or 0.0, speed or 0.0) or None
        rows[os.path.basename(path)] = row
        del llm, loaded
        print(os.path.basename(path), json.dumps(row), flush=True)

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs")
    print(
        f"| file | jaxgen 1 stream tok/s | llama.cpp | ratio | jaxgen {args.sequences} seqs "
        "tok/s | llama.cpp | ratio | parameter MB | file MB | x file |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    ratio = lambda a, b: f"{a / b:.2f}" if b else "-"  # noqa: E731
    for name, r in rows.items():
        print(f"| {name} | {r['single']:.1f} | {r['llama_single'] or 0:.1f} | "
              f"{ratio(r['single'], r['llama_single'])} | {r['batched']:.1f} | "
              f"{r['llama_batched'] or 0:.1f} | {ratio(r['batched'], r['llama_batched'])} | "
              f"{r['parameter_bytes'] / 1e6:.1f} | {r['file_bytes'] / 1e6:.1f} | "
              f"{r['parameter_bytes'] / r['file_bytes']:.2f} |")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
