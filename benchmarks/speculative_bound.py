"""The most any draft-length policy can get from n-gram prompt lookup on this machine: the
single-stream benchmark's prompts (``speculative_ngram.py``) decoded greedily once, then, on
those fixed token streams, the cheapest way through each answer when every step drafts exactly
the tokens of the n-gram proposal that the target will accept (known in hindsight), each step
priced by this engine's measured verify-step cost per drafted length.

    python benchmarks/speculative_bound.py [--tokens 128] [--k 3 4 8] [--prompt-lookup-min 2]
        [--prompt-lookup-max 5] [--passes 3] [--quantization auto|w4a8]

Costs: one engine per drafted length L (1 to max k) whose drafts are pinned to their full
length (the benchmark replaces ``best_length``; the engine itself cuts them to what pays), and
one whose proposer proposes nothing, each run over the input-grounded prompts ``--passes``
times after a warm pass; a step's cost is the median duration of its steps with L drafted
tokens over the median of the steps without drafts, from the engine's own step timing
(``Speculator.observe_step``). The first token of an answer comes from its prefill
(prefix cached but for its last partial page), timed apart, in decode steps.

The bound is an upper limit for the greedy n-gram configuration on this workload: a real
policy must guess acceptance, and pays for the drafts that miss.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from speculative_ngram import WORKLOADS, build  # noqa: E402


def greedy_streams(loaded, tokens: int) -> dict:
    """Each prompt's chat-templated token ids and greedy answer, and the answer's first-token
    time in seconds (prefix cached), from a plain engine."""
    from jaxgen import SamplingParams

    llm = build(loaded, 0, None)  # the benchmark's engine, without speculation
    params = SamplingParams(temperature=0.0, max_tokens=tokens)
    first = SamplingParams(temperature=0.0, max_tokens=1)
    streams = {}
    for workload, group in WORKLOADS.items():
        for name, text in group.items():
            messages = [{"role": "user", "content": text}]
            out = llm.chat(messages, params, use_tqdm=False)[0]
            times = []
            for _ in range(5):
                start = time.perf_counter()
                llm.chat(messages, first, use_tqdm=False)
                times.append(time.perf_counter() - start)
            streams[name] = (
                workload,
                list(out.prompt_token_ids),
                list(out.outputs[0].token_ids),
                statistics.median(times),
            )
    return streams


def step_costs(loaded, max_k: int, args) -> tuple[dict[int, float], float]:
    """Verify-step cost per drafted length 1..max_k in steps without drafts, and the median
    step without drafts in seconds."""
    from jaxgen import SamplingParams
    from jaxgen.engine.decoding.speculative import speculator as speculator_module
    from jaxgen.engine.decoding.speculative.ngram import NgramProposer

    durations = collections.defaultdict(list)
    measuring = [False]  # the warm pass is not timed
    observe = speculator_module.Speculator.observe_step

    def logged(self, seconds, rows, drafted_tokens):
        if rows == 1 and measuring[0]:
            durations[drafted_tokens].append(seconds)
        return observe(self, seconds, rows, drafted_tokens)

    pinned, propose = speculator_module.best_length, NgramProposer.propose
    speculator_module.Speculator.observe_step = logged
    speculator_module.best_length = lambda acceptance, cost, rows, length: length
    try:
        params = SamplingParams(temperature=0.0, max_tokens=args.tokens)
        prompts = list(WORKLOADS["input-grounded"].values())
        # 1-gram lookups too, so that nearly every step drafts its pinned length
        lookup = argparse.Namespace(prompt_lookup_min=1, prompt_lookup_max=args.prompt_lookup_max)
        for k in range(max_k + 1):
            # k = 0: steps without drafts at the same positions (nothing is proposed)
            NgramProposer.propose = (
                propose if k else lambda self, candidates, budget: [[] for _ in candidates]
            )
            llm = build(loaded, max(k, 1), lookup)
            for text in prompts:  # warm: every shape compiled and run once
                llm.chat([{"role": "user", "content": text}], params, use_tqdm=False)
            measuring[0] = True
            for _ in range(args.passes):
                for text in prompts:
                    llm.chat([{"role": "user", "content": text}], params, use_tqdm=False)
            measuring[0] = False
    finally:
        speculator_module.Speculator.observe_step = observe
        speculator_module.best_length = pinned
        NgramProposer.propose = propose
    plain = statistics.median(durations[0])
    costs = {d: statistics.median(durations[d]) / plain for d in range(1, max_k + 1)}
    return costs, plain


def proposals(prompt: list[int], answer: list[int], k: int, min_n: int, max_n: int):
    """At each answer position g >= 1: how many of the n-gram proposal's (up to k) tokens the
    target accepts there (the engine's lookup: ``NgramIndex``)."""
    from jaxgen.engine.decoding.speculative.ngram import NgramIndex
    from jaxgen.engine.scheduling.sequence import Sequence

    index = NgramIndex(min_n, max_n)
    seq = Sequence(list(prompt), max_tokens=len(answer))
    accepted = [0] * len(answer)
    for g in range(1, len(answer)):
        seq.output_token_ids.append(answer[g - 1])  # the answer up to position g
        room = min(k, len(answer) - g - 1)
        draft = index.propose(seq, room) if room >= 1 else []
        a = 0
        while a < len(draft) and draft[a] == answer[g + a]:
            a += 1
        accepted[g] = a
    return accepted


def cheapest(accepted: list[int], costs: dict[int, float]) -> float:
    """The fewest steps (without-draft units) from the answer's second token to its end when
    position g may draft up to accepted[g] tokens, all kept: a step drafting d advances d + 1."""
    n = len(accepted)
    best = [0.0] * (n + 1)
    for g in range(n - 1, 0, -1):
        best[g] = min(
            (1.0 if d == 0 else costs[d]) + best[min(g + d + 1, n)] for d in range(accepted[g] + 1)
        )
    return best[1] if n > 1 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--k", type=int, nargs="+", default=[3, 4, 8])
    parser.add_argument("--prompt-lookup-min", type=int, default=2)
    parser.add_argument("--prompt-lookup-max", type=int, default=5)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--quantization", default="auto", help="as speculative_ngram.py's")
    args = parser.parse_args()

    from jaxgen.loaders import load_model

    loaded = load_model(None, dtype="float32", quantization=args.quantization)
    streams = greedy_streams(loaded, args.tokens)
    costs, plain = step_costs(loaded, max(args.k), args)
    line = "  ".join(f"{d}: {cost:.2f}" for d, cost in costs.items())
    print(f"step without drafts {plain * 1e3:.2f} ms; with d drafted tokens, in such steps: {line}")
    for workload in WORKLOADS:
        for k in args.k:
            plain_steps = spec_steps = 0.0
            for group, prompt, answer, first_s in streams.values():
                if group != workload:
                    continue
                first = first_s / plain  # the first token's time in decode steps
                accepted = proposals(
                    prompt, answer, k, args.prompt_lookup_min, args.prompt_lookup_max
                )
                plain_steps += first + len(answer) - 1
                spec_steps += first + cheapest(accepted, costs)
            print(
                f"{workload:15s} k={k}: at most x{plain_steps / spec_steps:.2f} output tok/s"
                f" against no speculation (first tokens included)"
            )


if __name__ == "__main__":
    main()
