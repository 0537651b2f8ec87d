"""The engine's sampler alone (one executable per row bucket, every stage compiled in,
``GENERAL_FLAGS``) on the default model's vocabulary: microseconds a call for a batch of greedy
rows with nothing to apply (the common single-stream step), for one whose rows ask for
logprobs, and for one whose rows sample with top-p.

    python benchmarks/sampler_step.py [--rows 4 8 16] [--calls 400]

Logits (peaked as a model's, ``_peaked_logits``) rotate over eight arrays; prints the median and 10th percentile per batch kind and row
count. To compare two checkouts, run each (``PYTHONPATH=<checkout>``) in turn.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxgen import SamplingParams
from jaxgen.engine.sampling.sampler import sample
from jaxgen.engine.sampling.sampling_shapes import GENERAL_FLAGS, SamplingShapes
from jaxgen.engine.sampling.sampling_tensors import SamplingRow, build_sampling_tensors

VOCAB = 49152  # the default model's
KINDS = {
    "greedy": SamplingParams(temperature=0.0),
    "greedy + logprobs": SamplingParams(temperature=0.0, logprobs=1),
    "top-p": SamplingParams(temperature=0.8, top_p=0.9, seed=0),
}


def _peaked_logits(rng, rows: int) -> np.ndarray:
    """[rows, VOCAB] logits shaped like a language model's: probabilities falling as rank^-1.5
    (the 256 likeliest tokens hold about 95% of the mass), the ranks shuffled per row."""
    zipf = -1.5 * np.log(np.arange(1, VOCAB + 1, dtype=np.float32))
    return np.stack([rng.permutation(zipf) for _ in range(rows)]).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--calls", type=int, default=400)
    args = parser.parse_args()
    run = jax.jit(sample, static_argnames=("flags",))
    rng = np.random.default_rng(0)
    for rows in args.rows:
        shapes = SamplingShapes(vocab_size=VOCAB, max_model_len=1024, seq_cap=rows)
        logits = [jnp.asarray(_peaked_logits(rng, rows)) for _ in range(8)]
        for kind, params in KINDS.items():
            batch = [SamplingRow(params, [1, 2], [3]) for _ in range(rows)]
            tensors, _ = build_sampling_tensors(batch, rows, base_seed=0, step_counter=0)
            tensors = jax.device_put(shapes.fit(tensors))
            jax.block_until_ready(run(logits[0], tensors, flags=GENERAL_FLAGS))
            times = []
            for call in range(args.calls):
                start = time.perf_counter()
                jax.block_until_ready(run(logits[call % 8], tensors, flags=GENERAL_FLAGS))
                times.append(time.perf_counter() - start)
            print(
                f"rows {rows:3d}  {kind:18s} {np.median(times) * 1e6:7.0f} us"
                f"  (p10 {np.percentile(times, 10) * 1e6:.0f})"
            )


if __name__ == "__main__":
    main()
