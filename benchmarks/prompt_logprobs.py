"""What prompt logprobs cost: prefill of the same prompts with and without
``SamplingParams(prompt_logprobs=k)``, warm, alternating, as a ratio of the two in one run.

    python benchmarks/prompt_logprobs.py [--model M] [--prompts 4] [--prompt-len 480] [--rounds 3]

A prompt-logprobs step runs the LM head on every token row (not only the sampling rows) and
reads the log-softmax and top 20 of each; the rest of the step is unchanged.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=480)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--k", type=int, default=1)
    args = parser.parse_args()

    from jaxgen import LLM, SamplingParams

    llm = LLM(args.model, max_model_len=1024, enable_prefix_caching=False)
    rng = np.random.default_rng(0)
    vocab = llm.loaded.config.vocab_size
    prompts = [rng.integers(100, vocab, args.prompt_len).tolist() for _ in range(args.prompts)]
    plain = SamplingParams(max_tokens=1, temperature=0.0)
    asking = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=args.k)
    times = {"plain": [], "prompt_logprobs": []}
    for params in (plain, asking):  # warm-up: compiles every shape used below
        llm.generate(prompts, params, use_tqdm=False)
    compiles = llm.stats()["compiles"]
    for _ in range(args.rounds):
        for name, params in (("plain", plain), ("prompt_logprobs", asking)):
            start = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            times[name].append(time.perf_counter() - start)
    plain_s = float(np.median(times["plain"]))
    asking_s = float(np.median(times["prompt_logprobs"]))
    print(
        f"{args.prompts} prompts x {args.prompt_len} tokens, max_tokens=1, median of "
        f"{args.rounds}: plain {plain_s:.2f} s, prompt_logprobs={args.k} {asking_s:.2f} s, "
        f"ratio {asking_s / plain_s:.2f}x; compiles after warm-up: "
        f"{llm.stats()['compiles'] - compiles}"
    )


if __name__ == "__main__":
    main()
