"""Decoders as embedders: ``LLM(model, task="embed").embed`` equals transformers' hidden
states pooled as sentence-transformers pools them (and sentence-transformers itself), on tiny
random checkpoints; limits, compiles and refusals."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from jaxgen import LLM, PoolingParams
from tests.family_models import save_family_model, save_tiny_model
from tests.pooling.pooling_models import (
    agreement,
    drop_chat_template,
    hf_hidden_states,
    pooled,
    write_pooling_files,
)

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog, twice, and then once more for luck.",
    "a",
    "Embeddings pool a sequence's hidden states into one vector.",
]
# (variant, pooling): Llama with last-token pooling (Qwen3-Embedding's, e5-mistral's), Qwen3
# (q/k norms) with mean pooling, Gemma 2 (sliding window 8, soft caps) with [CLS]-style pooling.
CASES = [("llama", "LAST"), ("qwen3", "MEAN"), ("gemma2", "CLS")]


def _checkpoint(path: str, tokenizer, variant: str) -> str:
    if variant == "llama":
        return save_tiny_model(path, tokenizer)
    return save_family_model(path, tokenizer, variant)


@pytest.mark.parametrize("variant,pooling", CASES)
def test_embeddings_equal_transformers_hidden_states_pooled(
    tmp_path, smollm2_tokenizer, variant, pooling
):
    path = _checkpoint(str(tmp_path), smollm2_tokenizer, variant)
    write_pooling_files(path, pooling)
    llm = LLM(path, task="embed", max_model_len=64)
    outs = llm.embed(TEXTS)
    token_lists = [out.prompt_token_ids for out in outs]
    assert token_lists == [smollm2_tokenizer.encode(t, add_special_tokens=True) for t in TEXTS]
    reference = [pooled(h, pooling) for h in hf_hidden_states(path, token_lists)]
    delta, cosine = agreement([out.outputs.embedding for out in outs], reference)
    assert cosine >= 0.9999 and delta < 1e-4, (delta, cosine)
    assert llm.stats()["task"] == "embed"


def test_embeddings_equal_sentence_transformers(tmp_path, smollm2_tokenizer):
    """A base-model checkpoint saved by sentence-transformers (``Qwen3Model``: no LM head, no
    ``model.`` prefix) embeds under the default task, as ``SentenceTransformer.encode``."""
    st = pytest.importorskip("sentence_transformers")
    models = pytest.importorskip("sentence_transformers.models")
    decoder = save_family_model(str(tmp_path / "decoder"), smollm2_tokenizer, "qwen3")
    drop_chat_template(decoder)
    transformer = models.Transformer(decoder)
    transformer.tokenizer.pad_token = transformer.tokenizer.eos_token
    modules = [transformer, models.Pooling(64, "lasttoken"), models.Normalize()]
    path = str(tmp_path / "embedder")
    st.SentenceTransformer(modules=modules, device="cpu").save(path)
    reference = st.SentenceTransformer(path, device="cpu").encode(TEXTS, convert_to_numpy=True)
    llm = LLM(path)
    outs = llm.embed(TEXTS)
    delta, cosine = agreement([out.outputs.embedding for out in outs], reference)
    assert cosine >= 0.9999 and delta < 1e-4, (delta, cosine)
    with pytest.raises(ValueError, match="loaded for pooling"):
        llm.generate("Hi")


@pytest.fixture(scope="module")
def embedder(tmp_path_factory, smollm2_tokenizer):
    """A tiny Llama embedder allowing Matryoshka truncation, small limits (max_model_len 64,
    8 sequences and 128 tokens a batch)."""
    path = save_tiny_model(str(tmp_path_factory.mktemp("embedder")), smollm2_tokenizer)
    write_pooling_files(path, "LAST")
    config_file = os.path.join(path, "config.json")
    with open(config_file) as f:
        config = json.load(f)
    with open(config_file, "w") as f:
        json.dump({**config, "is_matryoshka": True}, f)
    return LLM(
        path,
        task="embed",
        max_model_len=64,
        max_rolling_batch_size=8,
        max_rolling_batch_prefill_tokens=128,
    )


def test_batches_compile_once_per_bucket(embedder):
    engine = embedder.pooling
    prompts = [list(range(5, 5 + n)) for n in (1, 3, 17, 40, 64, 2, 9, 33, 16, 5, 7, 50)]
    first = [out.outputs.embedding for out in embedder.embed(prompts)]
    compiles = engine.compiles
    assert compiles <= len(engine.length_buckets) * len(engine.batch_buckets)
    again = [out.outputs.embedding for out in embedder.embed(list(reversed(prompts)))]
    assert engine.compiles == compiles  # the same buckets: nothing new to compile
    np.testing.assert_allclose(first, list(reversed(again)), atol=1e-5)
    alone = embedder.embed(prompts[3])[0].outputs.embedding  # its batch's padding changes nothing
    np.testing.assert_allclose(alone, first[3], atol=1e-5)


def test_inputs_past_max_model_len_are_refused_naming_the_limit(embedder):
    with pytest.raises(ValueError, match=r"max_model_len\) of 64"):
        embedder.embed([list(range(1, 66))])
    with pytest.raises(ValueError, match="empty"):
        embedder.embed([[]])


def test_matryoshka_dimensions_truncate_then_normalise(embedder):
    full = embedder.embed("Hello world", PoolingParams(normalize=False))[0].outputs.embedding
    short = embedder.embed("Hello world", PoolingParams(dimensions=16))[0].outputs.embedding
    expected = np.asarray(full[:16]) / np.linalg.norm(full[:16])
    np.testing.assert_allclose(short, expected, atol=1e-6)
    with pytest.raises(ValueError, match="exceeds the embedding size"):
        embedder.embed("Hello", PoolingParams(dimensions=65))


def test_score_of_an_embedding_model_is_the_cosine(embedder):
    outs = embedder.score("Hello world", ["Hello there", "a fox"])
    vectors = [o.outputs.embedding for o in embedder.embed(["Hello world", "Hello there", "a fox"])]
    expected = [float(np.dot(vectors[0], v)) for v in vectors[1:]]  # unit vectors
    np.testing.assert_allclose([o.outputs.score for o in outs], expected, atol=1e-6)


def test_a_generation_model_without_pooling_refuses_embed(tiny_model_dir):
    llm = LLM(tiny_model_dir, max_model_len=64, kv_cache_memory=8 << 20)
    with pytest.raises(ValueError, match="no pooling defined"):
        llm.embed("Hello")
    with pytest.raises(ValueError, match="dimensions"):
        LLM(tiny_model_dir, task="embed", max_model_len=64).embed(
            "Hello", PoolingParams(dimensions=8)
        )


def test_more_inputs_than_a_batch_holds_take_several_batches(embedder):
    steps = embedder.pooling.num_steps
    outs = embedder.embed([[5, 6]] * 20)  # 8 sequences a batch at most
    assert len(outs) == 20 and embedder.pooling.num_steps - steps == 3
    np.testing.assert_allclose(outs[0].outputs.embedding, outs[19].outputs.embedding, atol=1e-6)
