"""Single-stream speed with n-gram speculative decoding against none, on the default model:
an input-grounded workload (the answer repeats spans of the prompt) and plain chat.

    python benchmarks/speculative_ngram.py [--tokens 128] [--k 2 4] [--repeats 2]

Each configuration is warmed up first (every shape it meets compiled), then each prompt runs
alone, greedy, the configurations taking turns prompt by prompt; prints output tok/s, the ratio
to no speculation by wall time and by the process's CPU time (steadier on a shared machine),
the compiles during the measured runs (0 when warm) and the acceptance counters. No speculation
runs in two engines, built first and last, and the ratios are to both together: on the CPU an
engine built earlier in the process can run a few per cent faster than one built later.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

CODE = """def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax


def average_price(items):
    if not items:
        return 0
    return sum(item.price for item in items) / len(items)
"""

GROUNDED = [
    "Rename the variable `subtotal` to `net` in this code and give the whole code back:\n\n" + CODE,
    "Add a docstring to each function of this code and give the whole code back:\n\n" + CODE,
    "Copy this text exactly, then say how many sentences it has:\n\nThe lighthouse stood on "
    "the rock for two hundred years. Ships passed it every night. The keeper lit the lamp at "
    "dusk and put it out at dawn. Nobody remembered a night it had not been lit.",
]
CHAT = [
    "Write a short story about a lighthouse keeper.",
    "What are three good habits for staying healthy?",
    "Explain how a bicycle stays upright.",
]


STAT_KEYS = (
    "spec_decode_num_drafts",
    "spec_decode_num_draft_tokens",
    "spec_decode_num_accepted_tokens",
    "steps",
    "compiles",
)


@dataclasses.dataclass
class Tally:
    """One engine's totals over the measured runs of one workload."""

    tokens: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    stats: dict = dataclasses.field(default_factory=dict)
    draft_token_cost: float | None = None  # the engine's measured cost at the end, in steps


def run_one(llm, prompt: str, params, tally: Tally) -> None:
    """Runs ``prompt`` alone on ``llm``; adds its tokens, wall and process CPU time, and the
    engine counters' change to ``tally``."""
    before = llm.stats()
    wall, cpu = time.perf_counter(), time.process_time()
    out = llm.chat([{"role": "user", "content": prompt}], params, use_tqdm=False)
    tally.wall_s += time.perf_counter() - wall
    tally.cpu_s += time.process_time() - cpu
    tally.tokens += len(out[0].outputs[0].token_ids)
    after = llm.stats()
    for key in STAT_KEYS:
        if key in after:
            tally.stats[key] = tally.stats.get(key, 0) + after[key] - before.get(key, 0)
    tally.draft_token_cost = after.get("spec_decode_draft_token_cost")


def report(workload: str, tallies: dict[str, Tally]) -> None:
    # The baseline: both engines without speculation, built first and last (an engine built
    # earlier in the process can run a few per cent faster than one built later).
    plain = [tally for name, tally in tallies.items() if name.startswith("none")]
    base = Tally(
        tokens=sum(t.tokens for t in plain),
        wall_s=sum(t.wall_s for t in plain),
        cpu_s=sum(t.cpu_s for t in plain),
    )
    for name, tally in tallies.items():
        stats = tally.stats
        rate = ""
        if "spec_decode_num_draft_tokens" in stats:
            drafted = max(stats["spec_decode_num_draft_tokens"], 1)
            rate = (
                f"  acceptance {stats['spec_decode_num_accepted_tokens'] / drafted:.2f}"
                f"  drafts {stats['spec_decode_num_drafts']}"
            )
            if tally.draft_token_cost is not None:
                rate += f"  draft token cost {tally.draft_token_cost:.2f} steps"
        print(
            f"{workload:15s} {name:17s} {tally.tokens / tally.wall_s:7.1f} tok/s"
            f"  x{base.wall_s / tally.wall_s * tally.tokens / base.tokens:.2f} wall"
            f"  x{base.cpu_s / tally.cpu_s * tally.tokens / base.tokens:.2f} cpu"
            f"  tokens {tally.tokens}  steps {stats['steps']}"
            f"  compiles {stats.get('compiles', 0)}{rate}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--k", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--prompt-lookup-max", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    from jaxgen import LLM, SamplingParams
    from jaxgen.loaders import load_model

    loaded = load_model(None, dtype="float32")
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens)
    knobs = dict(max_model_len=1024, max_rolling_batch_size=4, kv_cache_memory=64 << 20)
    engines = {"none, built first": LLM(loaded, **knobs)}
    for k in args.k:
        config = {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": args.prompt_lookup_max,
        }
        engines[f"ngram k={k}"] = LLM(loaded, **knobs, speculative_config=config)
    engines["none, built last"] = LLM(loaded, **knobs)
    for llm in engines.values():  # warm-up: every shape both workloads meet, the second
        for prompt in 2 * (GROUNDED + CHAT):  # time a prompt with its prefix cached
            run_one(llm, prompt, params, Tally())
    for workload, prompts in (("input-grounded", GROUNDED), ("chat", CHAT)):
        # Engines take turns prompt by prompt, so a change in the machine's load falls on all.
        tallies = {name: Tally() for name in engines}
        for _ in range(args.repeats):
            for prompt in prompts:
                for name, llm in engines.items():
                    run_one(llm, prompt, params, tallies[name])
        report(workload, tallies)


if __name__ == "__main__":
    main()
