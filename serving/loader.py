"""Building the ``AsyncLLM`` a server runs from its settings."""

from __future__ import annotations

import logging

from serving.settings import ServerSettings, engine_knobs

logger = logging.getLogger("serving")


def build_llm(settings: ServerSettings):
    """Loads the model and starts an ``AsyncLLM`` with the settings' engine knobs.

    ``kv_cache_tokens`` (TGI's MAX_BATCH_TOTAL_TOKENS) becomes a KV budget in bytes once the
    model's bytes per token are known.
    """
    import jax.numpy as jnp

    from jaxgen.async_llm import AsyncLLM
    from jaxgen.engine.engine_config import EngineConfig
    from jaxgen.engine.llm_engine import LLMEngine
    from jaxgen.loaders import load_model

    fields = set(EngineConfig.__dataclass_fields__)
    knobs = engine_knobs(settings, fields)
    if settings.tensor_parallel_degree not in (None, 1) and "tensor_parallel_degree" not in fields:
        logger.warning(
            "tensor_parallel_degree=%s is not supported by this engine yet; ignored",
            settings.tensor_parallel_degree,
        )
    config = EngineConfig(**knobs)  # check the knobs before the slow load
    loaded = load_model(settings.model, dtype=settings.dtype)
    if settings.kv_cache_tokens is not None:
        per_token = loaded.config.kv_bytes_per_token(jnp.dtype(loaded.dtype).itemsize)
        knobs["kv_cache_memory"] = settings.kv_cache_tokens * per_token
        config = EngineConfig(**knobs)
    engine = LLMEngine(loaded, config)
    logger.info("loaded %s in %.1f s (%s)", loaded.source, loaded.load_seconds, config)
    return AsyncLLM(engine=engine)
