"""A model that cannot run here in float32 runs quantised: a Llama-3-8B-shaped config built
directly in int4 (random codes, groups of 32 with minimums; int8 embedding and LM head), never a
float copy, then greedy single-token decode steps through the "cpu" backend's native kernels.
Prints parameter bytes, decode tok/s and the process's peak resident memory.

    python benchmarks/random_int4_8b.py [--steps 16] [--layers 32]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.model_shapes import LLAMA3_8B  # noqa: E402


def random_weight(rng, depth: int, columns: int, kind: str):
    """A random ``QuantizedWeight`` [depth, columns] made from codes, no float weight."""
    from jaxgen.quantization import QuantizedWeight

    groups = depth // 32
    scales = np.full((groups, columns), 0.02 / np.sqrt(depth) * 8, np.float16)
    if kind == "int4":
        values = rng.integers(0, 256, (depth // 2, columns), dtype=np.uint8)
        mins = (-7.5 * scales.astype(np.float32)).astype(np.float16)
        return QuantizedWeight(
            values, scales, mins, kind="int4", group_size=32, shape=(depth, columns)
        )
    values = rng.integers(-127, 128, (depth, columns), dtype=np.int8)
    return QuantizedWeight(values, scales, None, kind="int8", group_size=32, shape=(depth, columns))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--layers", type=int, default=32)
    args = parser.parse_args()

    from jaxgen.backends import select_backend
    from jaxgen.config import ModelConfig
    from jaxgen.evaluation.agreement import _forward
    from jaxgen.layers.attention import AttentionMetadata
    from jaxgen.layers.rope import inverse_frequencies
    from jaxgen.models.weights import abstract_model

    config = ModelConfig.from_hf_dict({**LLAMA3_8B, "num_hidden_layers": args.layers})
    graphdef, abstract = abstract_model(config, jnp.float32)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    leaves, total = [], 0
    for path, var in nnx.to_flat_state(abstract):
        shape = tuple(var.get_value().shape)
        if path == ("inv_freq",):
            value = jnp.asarray(inverse_frequencies(config))
        elif path[-1] == "kernel":
            kind = "int8" if path[0] == "lm_head" else "int4"
            value = jax.tree.map(jnp.asarray, random_weight(rng, *shape, kind))
        elif path[-1] == "embedding":  # held as its [hidden, vocab] head-layout kernel
            value = jax.tree.map(jnp.asarray, random_weight(rng, shape[1], shape[0], "int8"))
        else:
            value = jnp.ones(shape, jnp.float32)
        total += sum(leaf.nbytes for leaf in jax.tree.leaves(value))
        leaves.append((path, var.replace(value)))
    params = nnx.from_flat_state(leaves)
    built = time.perf_counter() - start
    backend = select_backend("auto")
    step_params, head = backend.prepare_params(params, config)
    del params, leaves  # the step runs on the packed copy
    page_size, pages = 16, -(-(args.steps + 8) // 16)
    kv = backend.allocate_kv_pool(config, pages + 1, page_size, jnp.float32)
    run = _forward(graphdef, backend)
    table = np.arange(1, pages + 1, dtype=np.int32)[None, :]
    token, times = np.array([1], np.int32), []
    for position in range(args.steps + 2):
        md = AttentionMetadata(
            slot_mapping=np.array(
                [table[0, position // page_size] * page_size + position % page_size], np.int32
            ),
            cu_q_lens=np.array([0, 1], np.int32),
            kv_lens=np.array([position + 1], np.int32),
            block_tables=table,
            num_seqs=np.array([1], np.int32),
            live_rows=np.array([[0, 1], [0, 0]], np.int32),
        )
        begin = time.perf_counter()
        logits = run(step_params, kv, token, np.array([position], np.int32), md, head)
        token = np.asarray(jnp.argmax(logits, -1), np.int32)
        times.append(time.perf_counter() - begin)
    step = float(np.median(times[2:]))  # the first steps compile
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"Llama-3-8B shape, {args.layers} layers, backend {backend.name}: parameters "
          f"{total / 1e9:.2f} GB (float32 would be {config.num_params * 4 / 1e9:.1f} GB), built in "
          f"{built:.0f} s; decode {1 / step:.2f} tok/s ({step * 1e3:.0f} ms/step, median of "
          f"{args.steps}); peak RSS {peak:.1f} GiB")  # fmt: skip


if __name__ == "__main__":
    main()
