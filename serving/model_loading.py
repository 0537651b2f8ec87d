"""Building the ``AsyncLLM`` a server runs from its settings."""

from __future__ import annotations

import dataclasses
import logging

import jax.numpy as jnp

from jaxgen.async_llm import AsyncLLM
from jaxgen.backends.device_choice import check_device_support, local_device
from jaxgen.config.engine_config import EngineConfig
from jaxgen.create_engine import create_engine, engine_dtype
from jaxgen.loaders import load_model, resolve_model
from serving.lora_adapters import register_lora_modules
from serving.pooling import build_pooling_llm
from serving.settings.parsers import SettingsError
from serving.settings.resolve import ServerSettings, engine_knobs

logger = logging.getLogger("serving")


def fetch_model(settings: ServerSettings) -> ServerSettings:
    """The settings with ``model_path``: the local checkpoint of ``model``, a hub id's files
    downloaded (or found in the cache) now, so that a bad id, a missing token or no network
    ends the command with its message before the server starts."""
    path = resolve_model(settings.model, revision=settings.revision, gguf_file=settings.gguf_file)
    return dataclasses.replace(settings, model_path=path)


def build_llm(settings: ServerSettings):
    """Loads the model and starts an ``AsyncLLM`` with the settings' engine knobs (a
    ``PoolingLLM`` when ``--task`` or the checkpoint asks for pooling)."""
    model = settings.model_path or fetch_model(settings).model_path
    knobs = engine_knobs(settings, set(EngineConfig.__dataclass_fields__))
    return build_pooling_llm(settings, knobs, model) or AsyncLLM(engine=build_engine(settings))


def build_engine(settings: ServerSettings):
    """Loads the model into an engine with the settings' engine knobs.

    ``kv_cache_tokens`` (TGI's MAX_BATCH_TOTAL_TOKENS) becomes a KV budget in bytes once the
    model's bytes per token are known (single-device engines only).
    """
    knobs = engine_knobs(settings, set(EngineConfig.__dataclass_fields__))
    knobs.setdefault("precompile", True)  # every step shape compiled before it reports healthy
    config = EngineConfig(**knobs)  # check the knobs before the slow load
    device = local_device()  # and what the device can run: a T4 has no bfloat16, no Triton
    check_device_support(device, dtype=settings.dtype, attention_backend=config.attention_backend)
    model = settings.model_path or fetch_model(settings).model_path
    if settings.kv_cache_tokens is not None:
        if config.tensor_parallel_degree != 1 or config.data_parallel_size != 1:
            raise SettingsError(
                "MAX_BATCH_TOTAL_TOKENS / --max-batch-total-tokens needs a single-device engine; "
                "give --kv-cache-memory instead"
            )
        model = load_model(
            model,
            dtype=engine_dtype(model, settings.dtype, device),
            quantization=config.quantization,
        )
        per_token = model.config.kv_bytes_per_token(jnp.dtype(model.dtype).itemsize)
        knobs["kv_cache_memory"] = settings.kv_cache_tokens * per_token
        config = EngineConfig(**knobs)
    engine = create_engine(model, dtype=settings.dtype, config=config, device=device)
    register_lora_modules(engine, settings.lora_modules)  # a bad adapter fails the start
    logger.info("loaded %s (%s)", engine.loaded.source, config)
    return engine
