"""A ``LoadedModel`` of random weights made on the device from an HF-style config (no checkpoint
can reach the device): every kernel and the embedding drawn N(0, 0.02), norms 1, RoPE tables as
the loaders compute them, and a word tokenizer over the vocabulary."""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
from flax import nnx

from benchmarks.gpu.word_tokenizer import word_tokenizer
from jaxgen.config import ModelConfig
from jaxgen.config.loaded_model import LoadedModel
from jaxgen.layers.rope import inverse_frequencies
from jaxgen.models.weights import abstract_model

WEIGHT_STD = 0.02


@functools.partial(jax.jit, static_argnames=("shape", "dtype"))
def _normal(key, shape, dtype):
    return jax.random.normal(key, shape, dtype) * jnp.asarray(WEIGHT_STD, dtype)


def random_loaded_model(hf_config: dict, dtype=jnp.bfloat16, seed: int = 0) -> LoadedModel:
    """The model of ``hf_config`` with random ``dtype`` weights, made on the default device."""
    start = time.perf_counter()
    config = ModelConfig.from_hf_dict(hf_config)
    graphdef, abstract = abstract_model(config, dtype)
    key = jax.random.key(seed, impl="rbg")  # XLA's bit generator: fast to compile and run
    leaves = []
    for path, variable in nnx.to_flat_state(abstract):
        leaf = variable.get_value()
        if path[-1] == "inv_freq":
            value = jnp.asarray(inverse_frequencies(config), leaf.dtype)
        elif path[-1] in ("kernel", "embedding"):
            key, sub = jax.random.split(key)
            value = _normal(sub, tuple(leaf.shape), leaf.dtype)
        else:  # norm weights (and any bias)
            value = jnp.ones(leaf.shape, leaf.dtype)
        leaves.append((path, variable.replace(value)))
    params = nnx.from_flat_state(leaves)
    jax.block_until_ready(jax.tree_util.tree_leaves(params))
    tokenizer = word_tokenizer(config.vocab_size)
    return LoadedModel(
        config, graphdef, params, tokenizer, "random", dtype, time.perf_counter() - start
    )


def parameter_bytes(loaded: LoadedModel) -> dict:
    """Bytes of every parameter, and of the input embedding table alone."""
    total = embedding = 0
    for path, variable in nnx.to_flat_state(loaded.params):
        size = variable.get_value().nbytes
        total += size
        if path[-1] == "embedding":
            embedding += size
    return {"param_bytes": total, "embedding_bytes": embedding}
