"""The engine's sampler as XLA compiles it for this machine: what its program holds."""

from __future__ import annotations

import jax.numpy as jnp

from jaxgen.engine.sampling.sampling_shapes import GENERAL_FLAGS, SamplingShapes
from jaxgen.engine.sampling.sampling_tensors import build_sampling_tensors
from jaxgen.sampling_params import SamplingParams
from tests.engine.sampling.sampler_checks import _rows, _sample_jit


def test_the_shape_stable_sampler_sorts_no_vocabulary():
    """The engine's sampler (every stage compiled in) keeps its top-k a top-k: XLA:CPU made a
    top-k whose indices went unused a sort of the whole vocabulary (30x slower)."""
    vocab = 4096
    shapes = SamplingShapes(vocab_size=vocab, max_model_len=64, seq_cap=4)
    rows = _rows([SamplingParams(temperature=0.8, top_p=0.9, seed=1)] * 4)
    tensors, _ = build_sampling_tensors(rows, 4, base_seed=0, step_counter=0)
    logits = jnp.zeros((4, vocab), jnp.float32)
    compiled = _sample_jit.lower(logits, shapes.fit(tensors), flags=GENERAL_FLAGS).compile()
    sorts = [line for line in compiled.as_text().splitlines() if " sort(" in line]
    assert not [line for line in sorts if f",{vocab}]" in line.split("sort(")[0]], sorts
