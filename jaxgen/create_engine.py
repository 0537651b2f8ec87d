"""The engine factory ``LLM``, ``AsyncLLM`` and the server call: a plain engine, a sharded
one, or replicas, as the configuration parallelises the model."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgen.backends.cpu_kernels import native_kernels_available
from jaxgen.backends.cpu_kernels.build import build_in_background
from jaxgen.backends.device_choice import (
    DeviceDescription,
    auto_dtype,
    check_device_support,
    local_device,
)
from jaxgen.caches.compile_cache import enable_compile_cache
from jaxgen.config.engine_config import EngineConfig
from jaxgen.engine.compiled import executable_store
from jaxgen.engine.llm_engine import LLMEngine
from jaxgen.layers.sharding import DeferredPlacement, shard_loaded
from jaxgen.loaders import (
    LoadedModel,
    load_model,
    load_sharded,
    model_config_only,
    resolve_model,
)
from jaxgen.parallel.replicas import ReplicatedEngine


def create_engine(
    model,
    *,
    dtype,
    config: EngineConfig,
    revision: str | None = None,
    gguf_file: str | None = None,
    device: DeviceDescription | None = None,
):
    """An ``LLMEngine`` (or a ``ReplicatedEngine``) for ``model`` as ``config`` parallelises it.

    ``model`` is a name, path or hub id (``revision`` and ``gguf_file`` as
    ``jaxgen.loaders.resolve_model`` takes them), or a ``LoadedModel``. Degree 1 and one replica
    is the plain engine on the default device; otherwise parameters are placed on a mesh as
    they load. ``device``: the devices' description (default: jax's default device,
    ``device_choice.local_device``); a ``dtype`` or ``attention_backend`` it cannot run is a
    ``ValueError`` before anything downloads or loads, and ``dtype="auto"`` is what it computes
    fastest in (:func:`engine_dtype`).
    """
    device = device or local_device()
    held = model.dtype if isinstance(model, LoadedModel) else dtype  # a loaded model's own
    check_device_support(device, dtype=held, attention_backend=config.attention_backend)
    if not isinstance(model, LoadedModel):  # a hub id is downloaded here, before any loading
        model = resolve_model(model, revision=revision, gguf_file=gguf_file)
    dtype = engine_dtype(model, dtype, device)
    enable_compile_cache(config.compile_cache)  # before anything compiles
    native_kernels = config.attention_backend in ("auto", "cpu")
    if native_kernels:
        build_in_background()  # an empty cache's kernel compile overlaps the load
    degree, replicas = config.tensor_parallel_degree, config.data_parallel_size
    if degree == 1 and replicas == 1:
        # The executables this job's last run used are read while the model loads.
        source = getattr(model, "source", model)
        executable_store.prefetch(
            repr((source, str(dtype), config)),
            before=native_kernels_available if native_kernels else None,
        )
        loaded = (
            model
            if isinstance(model, LoadedModel)
            else load_model(model, dtype=dtype, quantization=config.quantization)
        )
        return LLMEngine(loaded, config)
    devices = jax.devices() if replicas == 1 else jax.local_devices()  # replicas: one host
    placement = DeferredPlacement(degree, replicas, devices)
    loaded = load_sharded(model, dtype=dtype, placement=placement, quantization=config.quantization)
    rank = None if replicas == 1 else 0  # KV events say which replica (data_parallel_rank)
    engines = [
        LLMEngine(
            loaded, config, kv_sharding=placement.plans[0].kv_sharding, data_parallel_rank=rank
        )
    ]
    for rank, plan in enumerate(placement.plans[1:], 1):
        engines.append(
            LLMEngine(
                shard_loaded(loaded, plan),
                config,
                kv_sharding=plan.kv_sharding,
                data_parallel_rank=rank,
            )
        )
    return engines[0] if replicas == 1 else ReplicatedEngine(engines)


def engine_dtype(model, dtype, device: DeviceDescription):
    """``dtype``, with ``"auto"`` resolved for ``device`` and the model's family: on a GPU
    without bfloat16 a family float16 overflows takes float32 (``device_choice.auto_dtype``),
    so its config is read first. A ``LoadedModel`` keeps the dtype it was loaded in."""
    if not (isinstance(dtype, str) and dtype == "auto") or isinstance(model, LoadedModel):
        return dtype
    model_type = None if device.has_bfloat16 else model_config_only(model).model_type
    return jnp.dtype(auto_dtype(device, model_type)).name
