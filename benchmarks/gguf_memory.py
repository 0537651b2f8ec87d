"""Bytes held per weight for every kept GGUF type against the file's, and the native CPU matmul's
decode-shaped time on them.

Per type: one ``[rows, depth]`` tensor of random valid blocks (``tests.gguf_quant_blocks``)
written to a GGUF and read back with ``GGUFFile.get_quantized`` (``quantization="auto"``'s
form): bits a weight in the file, in the ``QuantizedWeight`` and in the "cpu" backend's packed
panels (``PackedQuantizedWeight``, which widen bit planes to int8 / int4 codes); and a whole
file, the 2-layer tiny model of ``tests/loaders/test_gguf_kept_models.py`` with every matrix in
the type, loaded with ``quantization="auto"``: its parameter bytes (``weight_stats``) against
the file's size. ``--time TYPES``: the median (and best) time of ``x @ w`` for 1 and 4 rows of
x over four such weights packed together (``pack_shared``).

    python benchmarks/gguf_memory.py [--rows 1024 --depth 2048] [--time Q4_K Q6_K] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import gguf
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxgen.backends.cpu_kernels import PackedQuantizedWeight, pack_shared  # noqa: E402
from jaxgen.loaders.gguf_blocks import KEPT_TYPES  # noqa: E402
from jaxgen.loaders.gguf_loader import GGUFFile  # noqa: E402
from jaxgen.quantization.stats import weight_stats  # noqa: E402
from tests.gguf_quant_blocks import random_gguf_tensor  # noqa: E402
from tests.loaders.test_gguf_kept_models import load_tiny, write_tiny_gguf  # noqa: E402

NAME = "model.layers.0.mlp.up_proj.weight"


def kept(qtype: str, rows: int, depth: int, directory: str, seed: int = 0):
    """(file bytes of the tensor, the kept ``QuantizedWeight``) for a random ``qtype`` tensor."""
    data = random_gguf_tensor(qtype, rows, depth, np.random.default_rng(seed))
    path = os.path.join(directory, f"{qtype}-{seed}.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_tensor("blk.0.ffn_up.weight", data, raw_dtype=gguf.GGMLQuantizationType[qtype])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return data.nbytes, GGUFFile(path).get_quantized(NAME)


def leaf_bytes(tree) -> int:
    return sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(tree))


def decode_times(weights, depth: int, repeats: int = 7, calls: int = 10) -> dict:
    """Median and best ms of one jitted call computing ``x @ w`` for every weight."""
    packed = pack_shared(weights)
    run = jax.jit(lambda x, ws: [w.matmul(x) for w in ws])
    times = {}
    for rows in (1, 4):
        x = jnp.asarray(np.random.default_rng(0).standard_normal((rows, depth)), jnp.float32)
        jax.block_until_ready(run(x, packed))
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(calls):
                jax.block_until_ready(run(x, packed))
            samples.append(1e3 * (time.perf_counter() - start) / calls)
        times[rows] = {"median_ms": statistics.median(samples), "best_ms": min(samples)}
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=2048)
    parser.add_argument("--time", nargs="*", default=[], help="types to time (4 x 5632 x 2048)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as directory:
        print("| type | file bits/weight | kept | packed (cpu) | kept / file |")
        print("| --- | --- | --- | --- | --- |")
        for qtype in KEPT_TYPES:
            file_bytes, weight = kept(qtype, args.rows, args.depth, directory)
            count = args.rows * args.depth
            bits = [8 * b / count for b in (file_bytes, weight.nbytes)]
            bits.append(8 * leaf_bytes(PackedQuantizedWeight.pack(weight, np)) / count)
            results[qtype] = {"file": bits[0], "kept": bits[1], "packed": bits[2]}
            print(f"| {qtype} | {bits[0]:.4g} | {bits[1]:.4g} | {bits[2]:.4g} | "
                  f"{bits[1] / bits[0]:.3f} |")  # fmt: skip
        print("\n| type | tiny model parameter bytes | file bytes | x file |")
        print("| --- | --- | --- | --- |")
        for qtype in KEPT_TYPES:
            path = write_tiny_gguf(os.path.join(directory, f"tiny-{qtype}.gguf"), qtype)
            held = weight_stats(load_tiny(path, "auto"))["parameter_bytes"]
            size = os.path.getsize(path)
            results[qtype]["tiny_model"] = {"parameter_bytes": held, "file_bytes": size}
            print(f"| {qtype} | {held} | {size} | {held / size:.3f} |")
        for qtype in args.time:
            weights = [kept(qtype, 5632, 2048, directory, seed)[1] for seed in range(4)]
            results[qtype]["decode"] = decode_times(weights, 2048)
            print(qtype, results[qtype]["decode"], flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)


if __name__ == "__main__":
    main()
