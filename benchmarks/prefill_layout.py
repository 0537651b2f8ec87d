"""The two step layouts on the native CPU backend, alternating in one process: ``rows`` (every
token a row of the native paged attention kernel, the engine's default there) against ``split``
(decode rows, then prefill rows through the blocked XLA prefill attention). Each run generates
for fresh random prompts (no prefix-cache hits) after a warm-up run of the same shape.

    python benchmarks/prefill_layout.py --num-prompts 4 --input-len 480 --output-len 16
"""

import argparse
import time

import numpy as np

from jaxgen import LLM, SamplingParams

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--num-prompts", type=int, default=16)
parser.add_argument("--input-len", type=int, default=128)
parser.add_argument("--output-len", type=int, default=16)
parser.add_argument("--rounds", type=int, default=2)
args = parser.parse_args()

llm = LLM(
    max_model_len=512,
    kv_cache_memory=1 << 30,
    max_rolling_batch_size=64,
    enable_prefix_caching=False,
)
runner = llm.engine.runner
rng = np.random.default_rng(0)
params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)


def prompts():
    return [rng.integers(100, 40000, args.input_len).tolist() for _ in range(args.num_prompts)]


for _ in range(args.rounds):
    for layout in ("split", "rows"):
        runner.token_rows = layout == "rows"
        llm.generate(prompts(), params, use_tqdm=False)  # compiles this layout's shapes
        compiles = llm.stats()["compiles"]
        start = time.perf_counter()
        llm.generate(prompts(), params, use_tqdm=False)
        seconds = time.perf_counter() - start
        print(
            f"{layout:5s} {seconds:6.2f} s  compiles in the run: {llm.stats()['compiles'] - compiles}"
        )
