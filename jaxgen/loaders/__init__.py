"""Loading a model by name or path: HF checkpoint directory, GGUF file, or the embedded default."""

from __future__ import annotations

import dataclasses
import json
import os
import time

import jax.numpy as jnp

from jaxgen.backends.device_choice import auto_dtype, local_device
from jaxgen.config import ModelConfig
from jaxgen.config.loaded_model import LoadedModel
from jaxgen.loaders.default_model import DEFAULT_MODEL_ALIASES, default_model_path
from jaxgen.loaders.gguf_loader import GGUFFile
from jaxgen.loaders.hf_checkpoint import hf_tensor_getter, load_hf_config
from jaxgen.loaders.hub_download import download_model, parse_hub_id
from jaxgen.loaders.hub_files import HubModelError
from jaxgen.loaders.orbax_checkpoint import METADATA_FILE, load_orbax
from jaxgen.loaders.tokenizer import load_tokenizer
from jaxgen.models.weights import params_from_hf_tensors
from jaxgen.quantization import validate_quantization

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def resolve_dtype(dtype, model_type: str | None = None) -> object:
    """``"float32"``/``"bfloat16"``/``"float16"`` (or ``"auto"``: what jax's default device
    computes fastest in for ``model_type``'s family, ``jaxgen.backends.device_choice.auto_dtype``:
    float32 rather than float16 for a family float16 overflows) to a dtype."""
    if dtype == "auto":
        return auto_dtype(local_device(), model_type)
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)} or 'auto', got {dtype!r}")
        return DTYPES[dtype]
    return jnp.dtype(dtype).type


def resolve_model(
    model: str | None,
    *,
    revision: str | None = None,
    gguf_file: str | None = None,
    config_only: bool = False,
) -> str:
    """The local checkpoint path for a model argument, downloading a hub id's files.

    Args:
        model: None or an alias (the embedded default), an existing local path (a checkpoint
            directory, a ``.gguf`` file, a converted directory: a path always wins), or a hub
            id: ``org/name``, or ``org/name:TAG`` for the GGUF file carrying quantisation tag
            ``TAG`` (llama.cpp's ``-hf`` form).
        revision: a hub id's branch, tag or commit (default: its main branch).
        gguf_file: the GGUF file to load, of a hub repository or of a local directory.
        config_only: a hub checkpoint's ``config.json`` only (``model_config_only``).

    Raises:
        ValueError: a ``revision`` or ``gguf_file`` that does not apply; a hub id that cannot be
            loaded (``jaxgen.loaders.hub_files.HubModelError``, saying what to do).
        FileNotFoundError: neither an existing path, an alias, nor shaped like a hub id.
    """
    if model is not None and not isinstance(model, str):
        raise ValueError(
            f"model must be a path, hub id or alias string, got {type(model).__name__}"
        )
    for name, value in (("revision", revision), ("gguf_file", gguf_file)):
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    if model is None or model.lower() in DEFAULT_MODEL_ALIASES:
        _refuse_source_options(model or "smollm2 (the default)", revision, gguf_file, "alias")
        return default_model_path()
    if os.path.exists(model):
        if gguf_file is not None and os.path.isdir(model):
            _refuse_source_options(model, revision, None, "local path")
            path = os.path.join(model, gguf_file)
            if not os.path.isfile(path):
                raise FileNotFoundError(f"gguf_file {gguf_file!r} is not a file in {model!r}")
            return path
        _refuse_source_options(model, revision, gguf_file, "local path")
        return model
    hub_id = parse_hub_id(model)
    if hub_id is None:
        raise FileNotFoundError(
            f"model {model!r} is not an existing local path (a checkpoint directory, a .gguf "
            f"file or a converted directory), an alias ({', '.join(DEFAULT_MODEL_ALIASES)}), "
            "nor a hub id (org/name, or org/name:Q4_K_M for a GGUF repository's file)"
        )
    repo_id, tag = hub_id
    return download_model(
        repo_id, revision=revision, gguf_file=gguf_file, tag=tag, config_only=config_only
    )


def is_hub_id(model) -> bool:
    """Whether ``resolve_model`` takes ``model`` for a hub id: shaped like ``org/name`` (or
    ``org/name:TAG``) and not an existing local path."""
    return isinstance(model, str) and not os.path.exists(model) and parse_hub_id(model) is not None


def _refuse_source_options(model: str, revision, gguf_file, kind: str) -> None:
    """``revision`` and ``gguf_file`` pick files of a hub repository: given with an alias or a
    local path (where they would be ignored) they are errors."""
    for name, value in (("revision", revision), ("gguf_file", gguf_file)):
        if value is not None:
            raise ValueError(
                f"{name}={value!r} applies to a hub id (org/name), but model {model!r} is a {kind}"
            )


def load_model(
    model: str | None = None,
    *,
    dtype="float32",
    place=None,
    quantization: str = "auto",
    revision: str | None = None,
    gguf_file: str | None = None,
) -> LoadedModel:
    """Loads config, weights and tokenizer from an HF directory, a ``.gguf`` file, the default,
    or a hub id (downloaded first: ``resolve_model``, with ``revision`` and ``gguf_file``).

    ``quantization`` (``jaxgen.quantization.QUANTIZATION_CHOICES``): ``"auto"`` keeps a GGUF's
    quantised tensors as the file holds them (every kept type: ``gguf_blocks.KEPT_TYPES``) and a
    float checkpoint float; ``"none"`` dequantises
    everything to ``dtype``; ``"int8"``, ``"int4"``, ``"fp8"`` quantise a float checkpoint's
    linear layers (and embedding / LM head) at load. A sharded load (``place``: a sharding
    plan) places quantised weights quantised, each split as its float kernel
    (``ShardingPlan.place_quantized``).
    """
    start = time.perf_counter()
    validate_quantization(quantization)
    path = resolve_model(model, revision=revision, gguf_file=gguf_file)
    jdtype = resolve_dtype(dtype)
    if os.path.isdir(path) and _is_orbax_dir(path):
        return load_orbax(path, dtype=jdtype, place=place, start=start)
    if os.path.isfile(path):
        if not path.endswith(".gguf"):
            raise ValueError(f"model file {path!r} is not a .gguf file")
        gguf_file = GGUFFile(path)
        config = ModelConfig.from_hf_dict(gguf_file.hf_config())
        jdtype = resolve_dtype(dtype, config.model_type)
        # First: a tokenizer jaxgen cannot reproduce exactly is refused before any weight loads.
        tokenizer = load_tokenizer(path, reader=gguf_file.reader)
        graphdef, params = params_from_hf_tensors(
            config,
            gguf_file.get_tensor,
            dtype=jdtype,
            place=_bind(place, config),
            quantization=quantization,
            get_quantized=gguf_file.get_quantized,
        )
        gguf_file.save_cache()  # the converted quantised tensors, for the next run
    else:
        config = load_hf_config(path)
        jdtype = resolve_dtype(dtype, config.model_type)
        graphdef, params = params_from_hf_tensors(
            config,
            hf_tensor_getter(path),
            dtype=jdtype,
            place=_bind(place, config),
            quantization=quantization,
        )
        tokenizer = load_tokenizer(path)
    config = _with_tokenizer_eos(config, tokenizer)
    return LoadedModel(
        config,
        graphdef,
        params,
        tokenizer,
        path,
        jdtype,
        time.perf_counter() - start,
        quantization=quantization,
    )


def load_sharded(model, *, dtype, placement, quantization: str = "auto"):
    """Loads ``model`` (a name/path, or a ``LoadedModel`` to re-place, quantised weights
    staying quantised) onto the first plan of ``placement`` (a
    ``jaxgen.layers.sharding.DeferredPlacement``)."""
    if isinstance(model, LoadedModel):
        plan = placement.bind(model.config)
        return dataclasses.replace(model, params=plan.place_state(model.params))
    return load_model(model, dtype=dtype, place=placement, quantization=quantization)


def model_config_only(
    model: str | None, *, revision: str | None = None, gguf_file: str | None = None
) -> ModelConfig:
    """The model's config without loading weights (GGUF metadata or ``config.json``; of a hub
    checkpoint only ``config.json`` is downloaded)."""
    path = resolve_model(model, revision=revision, gguf_file=gguf_file, config_only=True)
    if os.path.isfile(path):
        return ModelConfig.from_hf_dict(GGUFFile(path).hf_config())
    if os.path.isfile(os.path.join(path, METADATA_FILE)):
        with open(os.path.join(path, METADATA_FILE)) as f:
            return ModelConfig.from_hf_dict(json.load(f)["hf_config"])
    return load_hf_config(path)


def _bind(place, config: ModelConfig):
    """A deferred ``place`` (one with ``bind(config)``: a sharding plan) bound to the model."""
    return place.bind(config) if hasattr(place, "bind") else place


def _is_orbax_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, METADATA_FILE))


def _with_tokenizer_eos(config: ModelConfig, tokenizer) -> ModelConfig:
    eos = set(config.eos_token_ids)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        eos.add(tokenizer.eos_token_id)
    return dataclasses.replace(config, eos_token_ids=tuple(sorted(eos)))


__all__ = [
    "HubModelError",
    "LoadedModel",
    "is_hub_id",
    "load_model",
    "load_sharded",
    "model_config_only",
    "resolve_dtype",
    "resolve_model",
]
