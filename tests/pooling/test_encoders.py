"""BERT-family encoders (BERT, RoBERTa, XLM-R) from safetensors: embeddings equal
transformers' hidden states pooled as sentence-transformers pools them (and
sentence-transformers itself), cross-encoders' scores and logits equal transformers'."""

from __future__ import annotations

import numpy as np
import pytest

from jaxgen import LLM, PoolingParams
from tests.pooling.pooling_models import (
    agreement,
    assert_probabilities_are_the_softmax_of_its_logits,
    hf_hidden_states,
    pooled,
    save_tiny_encoder,
    write_pooling_files,
)

TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog in paris", "a"]
QUERY = "what is the capital of france"
DOCUMENTS = ["paris is a city", "the dog", "berlin is a city in the river of one vector"]


@pytest.mark.parametrize(
    "kind,pooling", [("bert", "CLS"), ("bert", "MEAN"), ("roberta", "MEAN"), ("xlm-roberta", "CLS")]
)
def test_embeddings_equal_transformers_hidden_states_pooled(tmp_path, kind, pooling):
    path = save_tiny_encoder(str(tmp_path), kind, seed=1)
    write_pooling_files(path, pooling)
    llm = LLM(path)  # an encoder embeds by default
    outs = llm.embed(TEXTS)
    token_lists = [out.prompt_token_ids for out in outs]
    reference = [pooled(h, pooling) for h in hf_hidden_states(path, token_lists)]
    delta, cosine = agreement([out.outputs.embedding for out in outs], reference)
    assert cosine >= 0.9999 and delta < 1e-4, (delta, cosine)
    with pytest.raises(ValueError, match="loaded for pooling"):
        llm.generate("hello")


def test_embeddings_equal_sentence_transformers(tmp_path):
    st = pytest.importorskip("sentence_transformers")
    models = pytest.importorskip("sentence_transformers.models")
    encoder = save_tiny_encoder(str(tmp_path / "encoder"), "bert", seed=2)
    modules = [models.Transformer(encoder), models.Pooling(64, "mean"), models.Normalize()]
    path = str(tmp_path / "embedder")
    st.SentenceTransformer(modules=modules, device="cpu").save(path)
    reference = st.SentenceTransformer(path, device="cpu").encode(TEXTS, convert_to_numpy=True)
    outs = LLM(path).embed(TEXTS)
    delta, cosine = agreement([out.outputs.embedding for out in outs], reference)
    assert cosine >= 0.9999 and delta < 1e-4, (delta, cosine)


def _hf_pair_logits(path: str, query: str, documents: list[str]) -> np.ndarray:
    import torch
    import transformers

    model = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    batch = tokenizer([query] * len(documents), documents, return_tensors="pt", padding=True)
    with torch.no_grad():
        return model(**batch).logits.numpy()


@pytest.mark.parametrize("kind", ["bert", "roberta", "xlm-roberta"])
def test_cross_encoder_scores_equal_its_logits(tmp_path, kind):
    path = save_tiny_encoder(str(tmp_path), kind, num_labels=1, seed=3)
    llm = LLM(path)  # a sequence classifier scores by default
    logits = _hf_pair_logits(path, QUERY, DOCUMENTS)[:, 0]
    raw = llm.score(QUERY, DOCUMENTS, PoolingParams(activation=False))
    np.testing.assert_allclose([o.outputs.score for o in raw], logits, atol=2e-5)
    scores = [o.outputs.score for o in llm.score(QUERY, DOCUMENTS)]
    np.testing.assert_allclose(scores, 1 / (1 + np.exp(-logits)), atol=1e-5)
    if kind == "bert":  # and as sentence-transformers' CrossEncoder predicts them
        cross_encoder = pytest.importorskip("sentence_transformers").CrossEncoder
        predicted = cross_encoder(path, device="cpu").predict([(QUERY, d) for d in DOCUMENTS])
        np.testing.assert_allclose(scores, predicted, atol=1e-5)
    with pytest.raises(ValueError, match="no pooling defined"):
        llm.embed("hello")


def test_classifier_probabilities_are_the_softmax_of_its_logits(tmp_path):
    path = save_tiny_encoder(str(tmp_path), "roberta", num_labels=3, seed=4)
    assert_probabilities_are_the_softmax_of_its_logits(path, TEXTS)


def test_inputs_past_the_position_table_are_refused(tmp_path):
    path = save_tiny_encoder(str(tmp_path), "bert")
    llm = LLM(path)
    assert llm.pooling.max_model_len == 64
    with pytest.raises(ValueError, match=r"max_model_len\) of 64"):
        llm.embed([[5] * 65])
    with pytest.raises(ValueError, match="positions"):
        LLM(path, max_model_len=128)
