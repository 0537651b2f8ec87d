"""Prefix-aware routing across Ray Serve replicas against Ray's default router: a multi-turn chat
workload's prefix-cache hit rate and time to first token.

Usage (from the repository root; ~5 min on a 2-core CPU):
  python benchmarks/ray_prefix_routing.py [--model DIR] [--conversations 24] [--turns 8]
      [--concurrency 6] [--routers prefix,default] [--json out.json]

Without ``--model`` a tiny random Llama (2 layers, hidden 64, the SmolLM2 tokenizer) is written
to a temporary directory first. One local Ray instance (2 CPUs) serves 2 replicas (half a CPU
each) per router in turn: ``prefix`` (the ingress and ``PrefixRouter``) and ``default`` (Ray's
power of two choices, replicas as the HTTP ingress). Each router gets the same workload:
``--conversations`` chats of ``--turns`` turns, ``--concurrency`` of them at a time, every turn a
streamed chat request (greedy, ``--max-tokens`` tokens) whose messages are the conversation so
far (the replies the server gave included). Every conversation opens with the same system
prompt. Replicas precompile their step shapes (as ``jaxgen serve`` does; ``--no-precompile``
skips it) and a warm-up of ``--concurrency`` conversations with other texts runs first (not
measured).

Reported per router: the prefix-cache hit rate from the replicas' ``/metrics``
(``jaxgen_prefix_cache_hit_pages_total`` x page size / ``jaxgen_prompt_tokens_total``, deltas
over the measured run, both replicas), the same from the responses' ``cached_tokens``, how often
a turn landed on the replica of the conversation's previous turn, and time to first token
(request sent to the first token's event) p50 / p99: over all turns, over first turns (nothing
of the conversation cached anywhere: what the routing path itself costs) and over turns 2+.
``--json`` also keeps every request's replica, time to first token and cached tokens.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[0] = str(ROOT)  # the repository, not benchmarks/ (whose kernels.py shadows a package)

PAGE_SIZE = 16
SYSTEM = "You are a helpful assistant. Answer briefly and stay on topic."
WORDS = (
    "river mountain cloud garden window letter market engine winter summer station harbor "
    "forest planet signal circle bridge lantern meadow orbit pencil violin desert island "
    "rocket castle candle silver copper thunder"
).split()


def tiny_model(path: str) -> str:
    from jaxgen.loaders.default_model import default_model_path
    from jaxgen.loaders.tokenizer import load_tokenizer
    from tests.conftest import save_tiny_model

    return save_tiny_model(path, load_tokenizer(default_model_path()))


def question(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "?"


def chat_turn(http, url: str, messages: list[dict], max_tokens: int) -> dict:
    """One streamed chat turn: appends the reply to ``messages``; returns its timings."""
    body = {
        "model": "tgi",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first, text, usage = None, "", {}
    with http.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as response:
        response.raise_for_status()
        replica = response.headers.get("x-jaxgen-replica")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {})
                if "role" not in delta and first is None:  # the first token's event
                    first = time.perf_counter()
                text += delta.get("content") or ""
    messages.append({"role": "assistant", "content": text})
    details = usage.get("prompt_tokens_details") or {}
    return {
        "replica": replica,
        "ttft_s": (first or time.perf_counter()) - start,
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "cached_tokens": details.get("cached_tokens", 0),
    }


def run_workload(url: str, args, seed: int, conversations: int) -> list[list[dict]]:
    """``conversations`` chats of ``args.turns`` turns, ``args.concurrency`` at a time."""
    import httpx

    def one(index: int) -> list[dict]:
        rng = random.Random(seed * 1000 + index)
        messages = [{"role": "system", "content": SYSTEM}]
        turns = []
        with httpx.Client() as http:
            for _ in range(args.turns):
                messages.append({"role": "user", "content": question(rng, args.question_words)})
                turns.append(chat_turn(http, url, messages, args.max_tokens))
        return turns

    with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
        return list(pool.map(one, range(conversations)))


def replica_counters(url: str, replicas: int = 2, tries: int = 200) -> dict[str, dict[str, float]]:
    """Each replica's prefix-hit pages and prompt tokens, from ``/metrics`` through the proxy
    (asked until every replica has answered once)."""
    import httpx

    names = (
        "jaxgen_prefix_cache_hit_pages_total",
        "jaxgen_prompt_tokens_total",
        "jaxgen_kv_pages_total",
    )
    found: dict[str, dict[str, float]] = {}
    for _ in range(tries):
        text = httpx.get(f"{url}/metrics", timeout=30).text
        for name in names:
            for replica, value in re.findall(rf'^{name}{{replica="([^"]+)"}} (\S+)$', text, re.M):
                found.setdefault(replica, {})[name] = float(value)
        if len(found) >= replicas:
            return found
    raise RuntimeError(f"only {len(found)} replica(s) answered /metrics")


def percentile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q)) if values else float("nan")


def summarise(router: str, runs: list[list[dict]], before: dict, after: dict, wall: float) -> dict:
    turns = [turn for run in runs for turn in run]
    firsts = [run[0] for run in runs]
    later = [turn for run in runs for turn in run[1:]]
    hits = prompts = 0.0
    for replica, counters in after.items():
        start = before.get(replica, {})
        hits += counters["jaxgen_prefix_cache_hit_pages_total"] - start.get(
            "jaxgen_prefix_cache_hit_pages_total", 0
        )
        prompts += counters["jaxgen_prompt_tokens_total"] - start.get(
            "jaxgen_prompt_tokens_total", 0
        )
    same = sum(
        a["replica"] == b["replica"] for run in runs for a, b in zip(run, run[1:], strict=False)
    )
    per_replica: dict[str, int] = {}
    for turn in turns:
        per_replica[turn["replica"]] = per_replica.get(turn["replica"], 0) + 1
    return {
        "router": router,
        "requests": len(turns),
        "wall_s": wall,
        "hit_rate_metrics": hits * PAGE_SIZE / prompts if prompts else 0.0,
        "hit_rate_usage": sum(t["cached_tokens"] for t in turns)
        / max(sum(t["prompt_tokens"] for t in turns), 1),
        "same_replica_as_previous_turn": same / max(len(later), 1),
        "ttft_p50_ms": 1000 * percentile([t["ttft_s"] for t in turns], 50),
        "ttft_p99_ms": 1000 * percentile([t["ttft_s"] for t in turns], 99),
        "ttft_first_p50_ms": 1000 * percentile([t["ttft_s"] for t in firsts], 50),
        "ttft_later_p50_ms": 1000 * percentile([t["ttft_s"] for t in later], 50),
        "ttft_later_p99_ms": 1000 * percentile([t["ttft_s"] for t in later], 99),
        "requests_per_replica": sorted(per_replica.values()),
        "kv_pool_tokens_per_replica": sorted(
            int(c.get("jaxgen_kv_pages_total", 0)) * PAGE_SIZE for c in after.values()
        ),
        "conversations": runs,
    }


def measure(router: str, model: str, args) -> dict:
    from ray import serve

    from serving.ray_app import ReplicaOptions, build_deployment

    engine = dict(
        model=model,
        max_model_len=args.max_model_len,
        kv_cache_memory=args.kv_cache_memory,
        page_size=PAGE_SIZE,
        max_rolling_batch_size=8,
        max_rolling_batch_prefill_tokens=args.prefill_tokens,
        precompile=args.precompile,
    )
    options = ReplicaOptions(num_replicas=2, cpus=0.5, request_router=router)
    url = f"http://127.0.0.1:{args.port}"
    start = time.perf_counter()
    serve.run(build_deployment(engine, options), name="jaxgen", route_prefix="/")
    print(f"[{router}] deployed in {time.perf_counter() - start:.0f} s", flush=True)
    run_workload(url, args, seed=999, conversations=args.concurrency)  # other texts
    before = replica_counters(url)
    start = time.perf_counter()
    runs = run_workload(url, args, seed=1, conversations=args.conversations)
    wall = time.perf_counter() - start
    after = replica_counters(url)
    serve.delete("jaxgen")
    result = summarise(router, runs, before, after, wall)
    brief = {k: v for k, v in result.items() if k != "conversations"}
    print(f"[{router}] {json.dumps(brief)}", flush=True)
    return result


def table(results: list[dict]) -> str:
    lines = [
        "| router | requests | prefix-hit rate (metrics) | (usage) | same replica as previous "
        "turn | TTFT p50 / p99 ms | first turns: TTFT p50 ms | turns 2+: TTFT p50 / p99 ms | "
        "requests per replica | wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['router']} | {r['requests']} | {r['hit_rate_metrics']:.1%} | "
            f"{r['hit_rate_usage']:.1%} | {r['same_replica_as_previous_turn']:.0%} | "
            f"{r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f} | {r['ttft_first_p50_ms']:.0f} | "
            f"{r['ttft_later_p50_ms']:.0f} / {r['ttft_later_p99_ms']:.0f} | "
            f"{r['requests_per_replica']} | {r['wall_s']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--routers", default="prefix,default")
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--question-words", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--kv-cache-memory", type=int, default=4 << 20, help="bytes per replica")
    parser.add_argument("--prefill-tokens", type=int, default=128, help="prefill chunk per step")
    parser.add_argument("--no-precompile", dest="precompile", action="store_false")
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = args.model or tiny_model(tempfile.mkdtemp(prefix="jaxgen-tiny-"))

    import ray
    from ray import serve

    ray.init(num_cpus=2, _temp_dir="/tmp/ray-jaxgen-bench", include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    try:
        results = [measure(router, model, args) for router in args.routers.split(",")]
    finally:
        serve.shutdown()
        ray.shutdown()
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
