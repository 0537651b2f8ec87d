"""``jaxgen convert MODEL OUT``: convert a checkpoint once, then start from it fast.

Loads ``MODEL`` (alias, HF directory or ``.gguf``), converts it to ``--dtype`` and saves the
parameters with orbax-checkpoint, plus ``jaxgen_orbax.json`` and the tokenizer. ``LLM(model=OUT)``
then restores every array straight into its target sharding, with no dequantising or transposing.
"""

from __future__ import annotations

import argparse
import os
import time

from jaxgen.loaders import load_model
from jaxgen.loaders.orbax_checkpoint import save_orbax
from jaxgen.sharding import DeferredPlacement


def convert(
    model: str | None,
    out: str,
    *,
    dtype: str = "float32",
    tensor_parallel_degree: int = 1,
    force: bool = False,
) -> str:
    """Converts ``model`` into ``out``; with a degree > 1 the save runs from sharded params."""
    if os.path.exists(out) and os.listdir(out) and not force:
        raise ValueError(f"output directory {out!r} is not empty (pass --force to overwrite)")
    if tensor_parallel_degree > 1:
        loaded = load_model(model, dtype=dtype, place=DeferredPlacement(tensor_parallel_degree))
    else:
        loaded = load_model(model, dtype=dtype, quantization="none")  # orbax holds float arrays
    return save_orbax(loaded, out, tensor_parallel_degree=tensor_parallel_degree)


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    out = convert(
        args.model,
        args.out,
        dtype=args.dtype,
        tensor_parallel_degree=args.tensor_parallel_degree,
        force=args.force,
    )
    print(
        f"converted {args.model or 'smollm2'} -> {out} ({args.dtype}) in "
        f"{time.perf_counter() - start:.1f} s"
    )
    return 0


def add_parser(sub) -> None:
    """Registers the ``convert`` subcommand."""
    parser = sub.add_parser("convert", help="save a model as an orbax checkpoint for fast start-up")
    parser.add_argument("model", help="alias (smollm2), HF checkpoint directory or .gguf file")
    parser.add_argument("out", help="output directory")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    parser.add_argument(
        "--tensor-parallel-degree",
        type=int,
        default=1,
        help="validate for and save from this many devices' shards",
    )
    parser.add_argument("--force", action="store_true", help="overwrite a non-empty OUT")
    parser.set_defaults(func=run)
