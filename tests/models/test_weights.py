"""Building the parameter state from checkpoint tensors (jaxgen.models.weights): the abstract
model and its quantisable paths, and the weights put on the device in batches."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxgen.config import ModelConfig
from jaxgen.families.checkpoint_names import hf_name
from jaxgen.models import weights
from jaxgen.models.weights import (
    abstract_model,
    params_from_hf_tensors,
    quantisable_paths,
    tensors_getter,
)

CONFIG = ModelConfig(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
)


def random_tensors(config: ModelConfig) -> dict[str, np.ndarray]:
    """HF-named tensors (torch layout) for every parameter of ``config``'s model."""
    rng = np.random.default_rng(0)
    tensors = {}
    for path, var in nnx.to_flat_state(abstract_model(config, jnp.float32)[1]):
        name = hf_name(path)
        if name is not None:
            shape = var.get_value().shape
            tensors[name] = rng.standard_normal(shape[::-1] if path[-1] == "kernel" else shape)
    return {name: array.astype(np.float32) for name, array in tensors.items()}


def test_quantisable_paths_are_kernels_and_the_embedding_table():
    paths = quantisable_paths(CONFIG)
    flat = [path for path, _ in nnx.to_flat_state(abstract_model(CONFIG, jnp.float32)[1])]
    assert paths == {p for p in flat if p[-1] == "kernel"} | {("embed_tokens", "embedding")}


@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_batched_transfers_give_the_same_state(monkeypatch, quantization):
    """One device_put for all the weights, or one every few bytes: the same arrays."""
    get = tensors_getter(random_tensors(CONFIG))
    _, whole = params_from_hf_tensors(CONFIG, get, quantization=quantization)
    monkeypatch.setattr(weights._BatchedTransfer, "BATCH_BYTES", 1)  # a transfer per leaf
    _, split = params_from_hf_tensors(CONFIG, get, quantization=quantization)
    assert jax.tree.structure(whole) == jax.tree.structure(split)
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(split), strict=True):
        assert isinstance(a, jax.Array) and isinstance(b, jax.Array)
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    _, placed = params_from_hf_tensors(  # a caller's place sees every float array
        CONFIG, get, quantization=quantization, place=lambda path, arr: jnp.asarray(arr)
    )
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(placed), strict=True):
        np.testing.assert_array_equal(a, b)


def test_wrong_shape_names_the_parameter():
    tensors = random_tensors(CONFIG)
    tensors["model.norm.weight"] = np.ones(5, np.float32)
    with pytest.raises(ValueError, match="'norm.weight'.*expected"):
        params_from_hf_tensors(CONFIG, tensors_getter(tensors))
