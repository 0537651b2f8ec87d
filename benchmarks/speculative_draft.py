"""Single-stream speed with a draft model against no speculation, on the default model: the
float32 target (its Q4_1 GGUF dequantised) drafted by its own checkpoint quantised at load
(int4 by default: an int4 self-draft), at several k.

    python benchmarks/speculative_draft.py [--tokens 128] [--k 2 4 8] [--prompts 3]
        [--draft-quantization int4] [--repeats 1] [--temperature 0.0] [--seed 0]

Each configuration is warmed up first (every shape it meets compiled), then each prompt runs
alone, greedy (or sampled at ``--temperature``, seeded: the same tokens in every
configuration); prints output tok/s, the ratio to no speculation, the acceptance rate and the
tokens a verify step gains (mean acceptance length) and the share of the time the draft
model's proposals take.
"""

from __future__ import annotations

import argparse
import time

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "What are three good habits for staying healthy?",
    "Explain how a bicycle stays upright.",
    "Give me a recipe for a simple tomato soup.",
]
COUNTERS = (
    "spec_decode_num_drafts",
    "spec_decode_num_draft_tokens",
    "spec_decode_num_accepted_tokens",
    "steps",
)


def timed_proposer(llm) -> dict:
    """Wraps ``llm``'s draft proposer to add up the seconds its proposals take (in "seconds")."""
    proposer = llm.engine.speculator.proposer
    timing = {"seconds": 0.0}
    propose = proposer.propose

    def timed(candidates, token_budget):
        start = time.perf_counter()
        try:
            return propose(candidates, token_budget)
        finally:
            timing["seconds"] += time.perf_counter() - start

    proposer.propose = timed
    return timing


def run(llm, prompts, params, repeats: int) -> tuple[float, dict]:
    """Output tok/s over ``prompts`` run one at a time, ``repeats`` times; the stats delta
    (with "elapsed": the seconds the run took)."""
    before = llm.stats()
    tokens, start = 0, time.perf_counter()
    for _ in range(repeats):
        for prompt in prompts:
            out = llm.chat([{"role": "user", "content": prompt}], params, use_tqdm=False)
            tokens += len(out[0].outputs[0].token_ids)
    elapsed = time.perf_counter() - start
    after = llm.stats()
    delta = {key: after[key] - before[key] for key in COUNTERS if key in after}
    return tokens / elapsed, delta | {"elapsed": elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--k", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--draft-quantization", default="int4")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0, help="the sampled requests' seed")
    args = parser.parse_args()

    from jaxgen import LLM, SamplingParams
    from jaxgen.loaders import load_model
    from jaxgen.loaders.default_model import default_model_path

    target = load_model(None, dtype="float32", quantization="none")
    draft = load_model(default_model_path(), dtype="float32", quantization=args.draft_quantization)
    prompts = PROMPTS[: args.prompts]
    params = SamplingParams(temperature=args.temperature, seed=args.seed, max_tokens=args.tokens)
    knobs = dict(max_model_len=1024, max_rolling_batch_size=4, kv_cache_memory=64 << 20)
    engines = {"none": LLM(target, **knobs)}
    for k in args.k:
        config = {"method": "draft_model", "model": draft, "num_speculative_tokens": k}
        engines[f"draft k={k}"] = LLM(target, **knobs, speculative_config=config)
    print(
        f"target float32 (dequantised), draft {args.draft_quantization} of the same checkpoint, "
        f"{len(prompts)} prompts x {args.tokens} tokens, one at a time, "
        f"{'greedy' if args.temperature == 0 else f'temperature {args.temperature}'}",
        flush=True,
    )
    for llm in engines.values():  # warm-up: every shape the prompts meet
        run(llm, prompts, params, 1)
    timings = {name: timed_proposer(llm) for name, llm in engines.items() if name != "none"}
    base = None
    for name, llm in engines.items():
        tok_s, delta = run(llm, prompts, params, args.repeats)
        base = base or tok_s
        rate = ""
        if "spec_decode_num_draft_tokens" in delta:
            drafted = max(delta["spec_decode_num_draft_tokens"], 1)
            accepted = delta["spec_decode_num_accepted_tokens"]
            rate = (
                f"  acceptance {accepted / drafted:.2f}"
                f"  tokens/verify {1 + accepted / max(delta['spec_decode_num_drafts'], 1):.2f}"
                f"  drafting {timings[name]['seconds'] / delta['elapsed']:.0%} of the time"
            )
        print(
            f"{name:10s} {tok_s:7.1f} tok/s  x{tok_s / base:.2f}  steps {delta['steps']}{rate}",
            flush=True,
        )


if __name__ == "__main__":
    main()
