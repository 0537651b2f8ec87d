"""The host KV tier on a multi-turn workload, CPU, default model: ``--conversations``
conversations of ``--turns`` turns (every conversation's turn t in one batch; each prompt the
whole history so far plus a new message), with a device pool ``--pool-fraction`` of the final
histories, with and without ``kv_offloading_size``. Reports the prefix-hit rate (prompt tokens
served from a cache / prompt tokens), TTFT p50/p99 (first token time less arrival, from each
output's metrics), output tok/s, and the bytes moved each way; both engines warm, interleaved.

    python benchmarks/kv_offload.py [--conversations 16] [--turns 6] [--message 48]
        [--output 16] [--pool-fraction 0.25] [--repeats 1]
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import time

import numpy as np

from jaxgen import LLM, SamplingParams
from jaxgen.loaders import load_model


def workload(llm, conversations: int, turns: int, message: int, output: int, seed: int):
    """Runs the conversations; returns (ttfts, prompt tokens, cached tokens, output tokens,
    seconds)."""
    rng = np.random.default_rng(seed)
    vocab = llm.loaded.config.vocab_size
    system = rng.integers(100, vocab, 64).tolist()  # one system prompt every conversation shares
    histories = [list(system) for _ in range(conversations)]
    params = SamplingParams(temperature=0.0, max_tokens=output, ignore_eos=True)
    ttfts, prompt_tokens, cached, generated, seconds = [], 0, 0, 0, 0.0
    for _ in range(turns):
        prompts = [h + rng.integers(100, vocab, message).tolist() for h in histories]
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds += time.perf_counter() - start
        for i, out in enumerate(outs):
            metrics = out.metrics or {}
            ttfts.append(metrics["first_token_time"] - metrics["arrival_time"])
            prompt_tokens += len(prompts[i])
            cached += out.num_cached_tokens
            generated += len(out.token_ids)
            histories[i] = prompts[i] + list(out.token_ids)
    return ttfts, prompt_tokens, cached, generated, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--message", type=int, default=48)
    parser.add_argument("--output", type=int, default=16)
    parser.add_argument("--pool-fraction", type=float, default=0.25)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    loaded = load_model(None)
    final = 64 + args.turns * (args.message + args.output)  # a history's last length
    page = 16
    pool_tokens = int(args.conversations * final * args.pool_fraction)
    probe = LLM(loaded, max_model_len=64, kv_cache_memory=1 << 24)
    per_token = probe.stats()["kv_bytes_per_token"]
    del probe
    max_model_len = -(-final // page) * page
    knobs = dict(
        max_model_len=max_model_len,
        kv_cache_memory=max(pool_tokens, max_model_len + page) * per_token,
        max_rolling_batch_size=args.conversations,
    )
    host_bytes = 2 * args.conversations * final * per_token  # room for every history
    engines = {
        "device pool only": LLM(loaded, **knobs),
        "with host tier": LLM(loaded, kv_offloading_size=host_bytes, **knobs),
    }
    for llm in engines.values():  # warm: every shape this workload meets, compiled
        workload(llm, args.conversations, 2, args.message, args.output, seed=99)
        llm.engine.reset_prefix_cache()
    rows = {name: [] for name in engines}
    for repeat in range(args.repeats):
        for name, llm in engines.items():
            before = llm.stats()
            ttfts, prompt, cached, generated, seconds = workload(
                llm, args.conversations, args.turns, args.message, args.output, seed=repeat
            )
            after = llm.stats()
            rows[name].append(
                (
                    cached / prompt,
                    np.percentile(ttfts, 50) * 1e3,
                    np.percentile(ttfts, 99) * 1e3,
                    generated / seconds,
                    after["kv_offloaded_bytes"] - before["kv_offloaded_bytes"],
                    after["kv_onloaded_bytes"] - before["kv_onloaded_bytes"],
                )
            )
            llm.engine.reset_prefix_cache()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    pool = knobs["kv_cache_memory"] // per_token
    print(
        f"{args.conversations} conversations x {args.turns} turns ({args.message}-token messages, "
        f"{args.output} tokens out), final histories {args.conversations * final} tokens, device "
        f"pool {pool} tokens, host tier {host_bytes >> 20} MiB; {platform.processor() or platform.machine()}, "
        f"git {commit}"
    )
    print(
        "| engine | prefix-hit rate | TTFT p50 ms | TTFT p99 ms | output tok/s | offloaded MiB | onloaded MiB |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, results in rows.items():
        for hit, p50, p99, tps, out_bytes, in_bytes in results:
            print(
                f"| {name} | {hit:.3f} | {p50:.0f} | {p99:.0f} | {tps:.1f} | "
                f"{out_bytes / 2**20:.1f} | {in_bytes / 2**20:.1f} |"
            )


if __name__ == "__main__":
    main()
