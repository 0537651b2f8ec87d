"""``jaxgen convert MODEL OUT``: convert a checkpoint once, then start from it fast.

Loads ``MODEL`` (alias, HF directory or ``.gguf``), converts it to ``--dtype`` and saves the
parameters with orbax-checkpoint, plus ``jaxgen_orbax.json`` and the tokenizer. ``LLM(model=OUT)``
then restores every array straight into its target sharding, with no dequantising or transposing.
"""

from __future__ import annotations

import os

from jaxgen.layers.sharding import DeferredPlacement
from jaxgen.loaders import load_model
from jaxgen.loaders.orbax_checkpoint import save_orbax


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
