"""Loading a model to pool: an encoder (BERT, RoBERTa, XLM-R, ModernBERT) from safetensors, or
a decoder run as an embedder, with the pooler its sentence-transformers files declare
(``PoolingEngine``)."""

from __future__ import annotations

import dataclasses
import os
import time

from jaxgen.config import ModelConfig
from jaxgen.config.encoder_config import EncoderConfig
from jaxgen.config.loaded_model import LoadedModel
from jaxgen.engine.pooling.pooler_config import PoolerConfig, checkpoint_pooling
from jaxgen.engine.pooling.pooling_engine import PoolingEngine
from jaxgen.families.encoders import encoder_family_of_hf
from jaxgen.loaders import load_model, resolve_dtype, resolve_model
from jaxgen.loaders.hf_checkpoint import hf_tensor_getter, read_hf_config, safetensors_files
from jaxgen.loaders.tokenizer import load_tokenizer
from jaxgen.models.encoder_weights import encoder_from_tensors
from jaxgen.models.weights import params_from_hf_tensors

# The pooler of a model whose checkpoint declares none (vLLM's defaults).
DECODER_POOLER = PoolerConfig("LAST", normalize=True)
ENCODER_POOLER = PoolerConfig("CLS", normalize=True)


def open_pooling_engine(
    model, *, dtype, config, revision: str | None = None, gguf_file: str | None = None
) -> PoolingEngine | None:
    """The ``PoolingEngine`` that ``config.task`` asks of ``model``, or None: the model
    generates (``task`` "generate", or "auto" on a decoder). An encoder embeds (pooling its
    hidden states) or classifies (its sequence classifier: "auto", "classify", "score"); a
    decoder embeds with "embed" or "score"."""
    task = config.task
    if task == "generate":
        return None
    if isinstance(model, LoadedModel):
        path, hf = model.source, {}
    else:
        path = resolve_model(model, revision=revision, gguf_file=gguf_file)
        is_checkpoint = os.path.isfile(os.path.join(path, "config.json"))
        hf = read_hf_config(path) if is_checkpoint else {}
    encoder = encoder_family_of_hf(hf) if hf else None
    if encoder is None and task == "auto" and not is_base_model(hf):
        return None
    pooler, matryoshka = checkpoint_pooling(path)
    if encoder is None:
        if task == "classify":
            raise ValueError("task='classify': decoder sequence classifiers are not supported")
        loaded = model if isinstance(model, LoadedModel) else None
        loaded = loaded or load_decoder(path, hf, dtype=dtype, quantization=config.quantization)
        classify, pooler = False, pooler or DECODER_POOLER
    else:
        has_classifier = encoder[1]
        if task == "classify" and not has_classifier:
            raise ValueError(f"task='classify': {hf.get('architectures')} has no classifier head")
        loaded = load_encoder(path, hf, dtype=dtype)
        classify, pooler = has_classifier and task != "embed", pooler or ENCODER_POOLER
    return PoolingEngine.from_config(
        loaded, pooler, classify=classify, matryoshka=matryoshka, config=config
    )


def pooling_beside(loaded: LoadedModel, config) -> PoolingEngine | None:
    """A pooling engine over a generation model's weights, when its checkpoint declares a
    sentence-transformers pooler (None: it has no pooling defined)."""
    pooler, matryoshka = checkpoint_pooling(loaded.source)
    if pooler is None:
        return None
    single = dataclasses.replace(config, tensor_parallel_degree=1, data_parallel_size=1)
    return PoolingEngine.from_config(
        loaded, pooler, classify=False, matryoshka=matryoshka, config=single
    )


def is_base_model(hf: dict) -> bool:
    """A decoder saved without its LM head (``Qwen3Model``, ``MistralModel``: e5-mistral and
    other sentence-transformers checkpoints): it embeds and cannot generate."""
    architectures = hf.get("architectures") or []
    return bool(architectures) and all(a.endswith("Model") for a in architectures)


def load_decoder(path: str, hf: dict, *, dtype, quantization: str) -> LoadedModel:
    """A decoder to embed with: a GGUF file or a generation checkpoint as ``load_model``
    reads it; a base-model checkpoint (tensors without the ``model.`` prefix, no LM head) with
    its embedding standing in as the head, which a pooling step never runs."""
    if not hf or not is_base_model(hf):
        return load_model(path, dtype=dtype, quantization=quantization)
    start = time.perf_counter()
    config = dataclasses.replace(ModelConfig.from_hf_dict(hf), tie_word_embeddings=True)
    get = hf_tensor_getter(path)
    names = safetensors_files(path)

    def base_tensor(name: str):
        return get(name if name in names else name.removeprefix("model."))

    jdtype = resolve_dtype(dtype, config.model_type)
    graphdef, params = params_from_hf_tensors(
        config, base_tensor, dtype=jdtype, quantization=quantization
    )
    tokenizer = load_tokenizer(path)
    seconds = time.perf_counter() - start
    return LoadedModel(config, graphdef, params, tokenizer, path, jdtype, seconds, quantization)


def load_encoder(path: str, hf: dict, *, dtype="float32") -> LoadedModel:
    """A BERT / RoBERTa / XLM-R / ModernBERT checkpoint directory (config.json, safetensors,
    tokenizer)."""
    start = time.perf_counter()
    names = safetensors_files(path)
    prefix = encoder_family_of_hf(hf)[0].prefix
    has_pooler = "pooler.dense.weight" in names or f"{prefix}pooler.dense.weight" in names
    config = EncoderConfig.from_hf_dict(hf, has_pooler=has_pooler)
    jdtype = resolve_dtype(dtype)
    graphdef, params = encoder_from_tensors(config, hf_tensor_getter(path), dtype=jdtype)
    tokenizer = load_tokenizer(path)
    seconds = time.perf_counter() - start
    return LoadedModel(config, graphdef, params, tokenizer, path, jdtype, seconds)
