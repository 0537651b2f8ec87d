"""64 chat prompts x 64 output tokens (ignore_eos) on the default model, three passes in one
process: output tokens per wall second including prefill, with steps and new compiles per pass.

    python benchmarks/chat_throughput.py [--batching paged] [--num-prompts 64] [--output-len 64]
"""

from __future__ import annotations

import argparse
import time

from jaxgen import LLM, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None)
    parser.add_argument("--batching", default="paged")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    llm = LLM(
        args.model,
        batching=args.batching,
        max_model_len=512,
        max_rolling_batch_size=args.num_prompts,
    )
    prompts = [
        [{"role": "user", "content": f"Tell me a fact about the number {i}."}]
        for i in range(args.num_prompts)
    ]
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    for index in range(args.passes):
        before = llm.stats()
        start = time.perf_counter()
        llm.chat(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        after = llm.stats()
        tokens = args.num_prompts * args.output_len
        print(
            f"pass {index}: {elapsed:.1f} s  {tokens / elapsed:.1f} tok/s  "
            f"steps {after['steps'] - before['steps']}  "
            f"compiles {after['compiles'] - before['compiles']}",
            flush=True,
        )


if __name__ == "__main__":
    main()
