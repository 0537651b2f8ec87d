"""Priority scheduling against first come, first served when a batch job floods the engine:
``--low`` long requests (``--low-prompt`` random prompt tokens, ``--low-tokens`` new tokens
each, priority ``--low-priority``) are queued at once and saturate the engine's ``--slots``
slots; from ``--first`` s on, ``--high`` short requests (``--high-prompt`` tokens,
``--high-tokens`` new tokens, priority 0) arrive every ``--gap`` s. For each scheduling policy,
the short requests' time to first token (p50, p99) and end-to-end latency, the long ones' last
finish and the preemptions (``--out``: every run and each short request's TTFT, as JSON).
Under ``fcfs`` every request has priority 0 (a non-zero one is refused there).

One ``AsyncLLM`` per policy over one loaded default model, precompiled and warmed; the
policies' runs alternate ``--repeats`` times. Greedy, ``ignore_eos``: every run does the same
tokens.

    python benchmarks/priority_scheduling.py [--low 24] [--high 12] [--slots 8] [--repeats 2]
        [--out priority.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import time

import numpy as np

from jaxgen import AsyncLLM, SamplingParams
from jaxgen.loaders import load_model

POLICIES = ("fcfs", "priority")


async def timed(llm, prompt, params, priority, delay) -> tuple[float, float]:
    """Waits ``delay`` s, then streams one request: (time to first token, end to end), s."""
    await asyncio.sleep(delay)
    start = time.perf_counter()
    first = None
    async for out in llm.generate(None, params, prompt_token_ids=prompt, priority=priority):
        if first is None and out.outputs[0].token_ids:
            first = time.perf_counter() - start
    return first, time.perf_counter() - start


async def flood(llm, policy: str, workload: dict, args) -> dict:
    """One run of the workload under ``policy``: its latencies and preemptions."""
    low = SamplingParams(temperature=0.0, max_tokens=args.low_tokens, ignore_eos=True)
    high = SamplingParams(temperature=0.0, max_tokens=args.high_tokens, ignore_eos=True)
    low_priority = args.low_priority if policy == "priority" else 0
    preemptions = llm.stats()["preemptions"]
    runs = [timed(llm, p, low, low_priority, 0.0) for p in workload["low"]]
    runs += [
        timed(llm, p, high, 0, args.first + i * args.gap) for i, p in enumerate(workload["high"])
    ]
    results = await asyncio.gather(*runs)
    lows, highs = results[: args.low], results[args.low :]
    await asyncio.sleep(0.2)  # the engine thread's counters after its last step
    high_ttft = [first for first, _ in highs]
    return {
        "policy": policy,
        "high_ttft_p50": float(np.percentile(high_ttft, 50)),
        "high_ttft_p99": float(np.percentile(high_ttft, 99)),
        "high_e2e_p50": float(np.percentile([e2e for _, e2e in highs], 50)),
        "low_ttft_p50": float(np.percentile([first for first, _ in lows], 50)),
        "low_last_finish": max(e2e for _, e2e in lows),
        "preemptions": llm.stats()["preemptions"] - preemptions,
        "high_ttft": [round(first, 3) for first in high_ttft],  # in arrival order
    }


def machine() -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    load = os.getloadavg()[0]
    cpu = platform.processor() or platform.machine()
    return f"{cpu}, {os.cpu_count()} cores, load {load:.1f} at start, commit {commit or '?'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--low", type=int, default=24, help="long requests of the flood")
    parser.add_argument("--low-prompt", type=int, default=128)
    parser.add_argument("--low-tokens", type=int, default=96)
    parser.add_argument("--low-priority", type=int, default=10)
    parser.add_argument("--high", type=int, default=12, help="short requests after it")
    parser.add_argument("--high-prompt", type=int, default=16)
    parser.add_argument("--high-tokens", type=int, default=8)
    parser.add_argument("--first", type=float, default=2.0, help="s before the first short one")
    parser.add_argument("--gap", type=float, default=0.5, help="s between short requests")
    parser.add_argument("--slots", type=int, default=8, help="max_rolling_batch_size")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=None, help="also write the runs here, as JSON")
    args = parser.parse_args()
    context = machine()
    print(context)
    loaded = load_model(None)
    rng = np.random.default_rng(0)
    vocab = loaded.config.vocab_size
    workload = {
        "low": [rng.integers(100, vocab, args.low_prompt).tolist() for _ in range(args.low)],
        "high": [rng.integers(100, vocab, args.high_prompt).tolist() for _ in range(args.high)],
    }
    knobs = dict(max_model_len=512, max_rolling_batch_size=args.slots, precompile=True)
    engines = {policy: AsyncLLM(loaded, scheduling_policy=policy, **knobs) for policy in POLICIES}
    warm = {"low": workload["low"][: args.slots], "high": workload["high"][:2]}
    warm_args = argparse.Namespace(**{**vars(args), "low": args.slots, "first": 0.0})
    for policy, llm in engines.items():
        asyncio.run(flood(llm, policy, warm, warm_args))
    rows = []
    try:
        for _ in range(args.repeats):  # alternated: drift and other load hit both alike
            for policy, llm in engines.items():
                rows.append(asyncio.run(flood(llm, policy, workload, args)))
    finally:
        for llm in engines.values():
            llm.shutdown()
    print(
        f"{args.low} x ({args.low_prompt} prompt + {args.low_tokens} new) tokens at priority "
        f"{args.low_priority}, then {args.high} x ({args.high_prompt} + {args.high_tokens}) at "
        f"priority 0 every {args.gap} s from {args.first} s; {args.slots} slots; seconds"
    )
    print(
        "| policy | short TTFT p50 | short TTFT p99 | short e2e p50 | long TTFT p50 "
        "| long last finish | preemptions |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['policy']} | {row['high_ttft_p50']:.3f} | {row['high_ttft_p99']:.3f} "
            f"| {row['high_e2e_p50']:.3f} | {row['low_ttft_p50']:.3f} "
            f"| {row['low_last_finish']:.2f} | {row['preemptions']} |"
        )
    for row in rows:
        print(f"{row['policy']}: short TTFTs in arrival order {row['high_ttft']}")
    if args.out:
        with open(args.out, "w") as out:
            json.dump({"machine": context, "args": vars(args), "runs": rows}, out, indent=2)


if __name__ == "__main__":
    main()
