"""Converted checkpoints: parameters saved with orbax-checkpoint, restored straight into shardings.

A directory written by ``jaxgen convert`` (``save_orbax``) holds ``params/`` (an orbax checkpoint
of the flat parameter dict, keyed by dotted path), ``jaxgen_orbax.json`` (the ``ModelConfig`` and
dtype) and the tokenizer files. Restoring skips dequantisation and transposes entirely: each
array is read from disk directly into its target device layout.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxgen.config import ModelConfig
from jaxgen.config.loaded_model import LoadedModel
from jaxgen.layers.sharding import path_name
from jaxgen.loaders.tokenizer import load_tokenizer
from jaxgen.models.weights import abstract_model

METADATA_FILE = "jaxgen_orbax.json"
PARAMS_DIR = "params"
FORMAT_VERSION = 1


def config_to_dict(config: ModelConfig) -> dict:
    return dataclasses.asdict(config)


def config_from_dict(data: dict) -> ModelConfig:
    return ModelConfig.from_dict(data)


def _flat_params(state) -> dict[str, jax.Array]:
    return {path_name(path): var.get_value() for path, var in nnx.to_flat_state(state)}


def save_orbax(loaded, out: str, *, tensor_parallel_degree: int = 1) -> str:
    """Writes ``loaded`` (a ``LoadedModel``, possibly sharded) to ``out``; returns ``out``."""
    out = os.path.abspath(out)
    os.makedirs(out, exist_ok=True)
    import orbax.checkpoint as ocp  # start-up time: 0.5 s to import, for converted models only

    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(os.path.join(out, PARAMS_DIR), _flat_params(loaded.params), force=True)
    checkpointer.wait_until_finished()
    if jax.process_index() == 0:
        loaded.tokenizer.save_pretrained(out)
        metadata = {
            "format_version": FORMAT_VERSION,
            "config": config_to_dict(loaded.config),
            "dtype": jnp.dtype(loaded.dtype).name,
            "tensor_parallel_degree": tensor_parallel_degree,
            "source": loaded.source,
        }
        with open(os.path.join(out, METADATA_FILE), "w") as f:
            json.dump(metadata, f, indent=2)
    return out


def read_metadata(path: str) -> dict:
    with open(os.path.join(path, METADATA_FILE)) as f:
        metadata = json.load(f)
    if metadata.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{METADATA_FILE} in {path!r} has format_version {metadata.get('format_version')!r}; "
            f"this jaxgen reads {FORMAT_VERSION} (re-run jaxgen convert)"
        )
    return metadata


def load_orbax(path: str, *, dtype, place=None, start: float | None = None):
    """Restores a converted directory as a ``LoadedModel`` in ``dtype``.

    ``place`` is the loaders' hook: None keeps every array on the default device; a hook with a
    ``sharding_for(path)`` method (``jaxgen.layers.sharding.ShardingPlan``) has each array
    restored directly into that sharding; any other ``place(path, array)`` gets host arrays.
    """
    start = time.perf_counter() if start is None else start
    metadata = read_metadata(path)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # tokenizer loads during the restore
        tokenizer = pool.submit(load_tokenizer, path)
        params, graphdef, config = _restore(path, metadata, dtype, place)
        tokenizer = tokenizer.result()
    seconds = time.perf_counter() - start
    return LoadedModel(config, graphdef, params, tokenizer, path, dtype, seconds)


def read_orbax_params(path: str, *, dtype):
    """The parameter state of a converted directory alone, in ``dtype``, on the default device
    (no tokenizer: ``LLM.update_weights_from_path``)."""
    return _restore(path, read_metadata(path), dtype, None)[0]


def _restore(path: str, metadata: dict, dtype, place):
    import orbax.checkpoint as ocp  # start-up time: 0.5 s to import, for converted models only

    config = config_from_dict(metadata["config"])
    graphdef, abstract = abstract_model(config, dtype)
    flat = nnx.to_flat_state(abstract)
    if hasattr(place, "bind"):  # a deferred placement: plan it for this config
        place = place.bind(config)
    sharding_for = getattr(place, "sharding_for", None)
    default = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = {}
    for key, var in flat:
        value = var.get_value()
        sharding = sharding_for(key) if sharding_for is not None else default
        target[path_name(key)] = jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=sharding)
    checkpointer = ocp.StandardCheckpointer()
    restored = checkpointer.restore(os.path.join(os.path.abspath(path), PARAMS_DIR), target)
    leaves = []
    for key, var in flat:
        value = restored[path_name(key)]
        if place is not None and sharding_for is None:
            value = place(key, np.asarray(value))
        leaves.append((key, var.replace(value)))
    return nnx.from_flat_state(leaves), graphdef, config
