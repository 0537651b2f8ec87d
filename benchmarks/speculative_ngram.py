"""Single-stream speed with n-gram speculative decoding against none, on the default model:
an input-grounded workload (the answer repeats spans of the prompt) and plain chat.

    python benchmarks/speculative_ngram.py [--tokens 128] [--k 2 4] [--repeats 2]

Each configuration is warmed up first (every shape it meets compiled), then each prompt runs
alone, greedy; prints output tok/s, the ratio to no speculation, and the acceptance counters.
"""

from __future__ import annotations

import argparse
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


def run(llm, prompts, params, repeats: int) -> tuple[float, dict]:
    """Output tok/s over ``prompts`` run one at a time, ``repeats`` times; the stats delta."""
    before = llm.stats()
    tokens, start = 0, time.perf_counter()
    for _ in range(repeats):
        for prompt in prompts:
            out = llm.chat([{"role": "user", "content": prompt}], params, use_tqdm=False)
            tokens += len(out[0].outputs[0].token_ids)
    elapsed = time.perf_counter() - start
    after = llm.stats()
    delta = {
        key: after[key] - before.get(key, 0)
        for key in (
            "spec_decode_num_drafts",
            "spec_decode_num_draft_tokens",
            "spec_decode_num_accepted_tokens",
            "steps",
        )
        if key in after
    }
    return tokens / elapsed, delta


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
    engines = {"none": LLM(loaded, **knobs)}
    for k in args.k:
        config = {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": args.prompt_lookup_max,
        }
        engines[f"ngram k={k}"] = LLM(loaded, **knobs, speculative_config=config)
    for llm in engines.values():  # warm-up: every shape both workloads meet
        run(llm, GROUNDED + CHAT, params, 1)
    for workload, prompts in (("input-grounded", GROUNDED), ("chat", CHAT)):
        base = None
        for name, llm in engines.items():
            tok_s, delta = run(llm, prompts, params, args.repeats)
            base = base or tok_s
            rate = ""
            if "spec_decode_num_draft_tokens" in delta:
                drafted = max(delta["spec_decode_num_draft_tokens"], 1)
                rate = (
                    f"  acceptance {delta['spec_decode_num_accepted_tokens'] / drafted:.2f}"
                    f"  drafts {delta['spec_decode_num_drafts']}"
                )
            print(
                f"{workload:15s} {name:10s} {tok_s:7.1f} tok/s  x{tok_s / base:.2f}"
                f"  steps {delta['steps']}{rate}",
                flush=True,
            )


if __name__ == "__main__":
    main()
