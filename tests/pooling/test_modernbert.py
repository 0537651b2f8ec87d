"""ModernBERT from safetensors (rotary positions, global layers and bidirectional sliding-window
local layers, GeGLU, bias-free LayerNorms): embeddings equal sentence-transformers' and
transformers' hidden states pooled, cross-encoder scores equal
``ModernBertForSequenceClassification``'s logits (``classifier_pooling`` cls and mean), all
fp32 with inputs of several lengths in one batch, longer than the window."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from jaxgen import LLM, PoolingParams
from jaxgen.config.encoder_config import EncoderConfig
from tests.pooling.pooling_models import (
    agreement,
    assert_probabilities_are_the_softmax_of_its_logits,
    hf_hidden_states,
    hf_outputs,
    pooled,
    save_tiny_encoder,
    write_pooling_files,
)

# 4 to 30 tokens: one batch of the engine (one length bucket), all but one past the window.
TEXTS = [
    "hello world",
    "the quick brown fox jumps over the lazy dog",
    "a",
    "what is the capital of france paris is a city on a river and berlin is a city too "
    "embeddings pool sequence hidden states into one vector",
]
QUERY = "what is the capital of france"
DOCUMENTS = ["paris is a city", "the dog", "berlin is a city in the river of one vector " * 2]
WINDOW = 8  # local_attention: a local layer's row sees 4 rows on each side
SMALL = dict(num_hidden_layers=3, local_attention=WINDOW, max_position_embeddings=128)
EMBEDDERS = {  # pooling -> the ModernBERT's own fields
    "MEAN": dict(global_attn_every_n_layers=2, global_rope_theta=1000.0, local_rope_theta=50.0),
    "CLS": dict(global_attn_every_n_layers=3, global_rope_theta=160_000.0),
}


def _save(path, *, seed: int, num_labels: int = 0, **fields) -> str:
    return save_tiny_encoder(
        str(path), "modernbert", num_labels=num_labels, seed=seed, **SMALL, **fields
    )


def _config_json(path: str) -> dict:
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("pooling", ["MEAN", "CLS"])
def test_embeddings_equal_sentence_transformers_and_transformers(tmp_path, pooling):
    st = pytest.importorskip("sentence_transformers")
    models = pytest.importorskip("sentence_transformers.models")
    encoder = _save(tmp_path / "encoder", seed=1, **EMBEDDERS[pooling])
    eager = {"attn_implementation": "eager"}
    modules = [
        models.Transformer(encoder, model_kwargs=eager),
        models.Pooling(64, pooling.lower()),
        models.Normalize(),
    ]
    path = str(tmp_path / "embedder")
    st.SentenceTransformer(modules=modules, device="cpu").save(path)
    reference = st.SentenceTransformer(path, device="cpu", model_kwargs=eager).encode(TEXTS)
    llm = LLM(path)
    outs = llm.embed(TEXTS)
    assert llm.pooling.num_steps == 1  # every length in one padded batch
    ours = [out.outputs.embedding for out in outs]
    delta, cosine = agreement(ours, reference)
    print(f"\nModernBERT {pooling} embeddings vs sentence-transformers: max |d| {delta:.2e}")
    assert cosine >= 0.9999 and delta < 1e-4, (delta, cosine)

    tokens = [out.prompt_token_ids for out in outs]
    assert max(map(len, tokens)) > 3 * WINDOW and min(map(len, tokens)) < WINDOW
    hidden = hf_hidden_states(path, tokens)  # one sequence at a time: no padding at all
    alone = [pooled(h, pooling) for h in hidden]
    delta, cosine = agreement(ours, alone)
    print(f"ModernBERT {pooling} embeddings vs transformers (unpadded): max |d| {delta:.2e}")
    assert cosine >= 0.9999 and delta < 1e-4, (delta, cosine)


def test_the_window_and_the_local_base_change_the_embeddings(tmp_path):
    """The checks above are not blind to the local layers: with a window past every input
    (and the global base on every layer) transformers' embedding of the long input moves."""
    path = _save(tmp_path / "windowed", seed=1, **EMBEDDERS["MEAN"])
    write_pooling_files(path, "MEAN")
    out = LLM(path).embed(TEXTS[3])[0]
    ours, tokens = out.outputs.embedding, out.prompt_token_ids
    config = _config_json(path)
    for field, value in (("local_attention", 1024), ("rope_parameters", None)):
        changed = {**config, field: value}
        if value is None:  # the local layers rotated with the global base
            theta = config["rope_parameters"]["full_attention"]["rope_theta"]
            changed[field] = {
                kind: {"rope_type": "default", "rope_theta": theta}
                for kind in ("full_attention", "sliding_attention")
            }
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(changed, f)
        other = pooled(hf_hidden_states(path, [tokens])[0], "MEAN")
        delta, _ = agreement([ours], [other])
        assert delta > 1e-3, (field, delta)


@pytest.mark.parametrize("classifier_pooling", ["cls", "mean"])
def test_cross_encoder_scores_equal_its_logits(tmp_path, classifier_pooling):
    import transformers

    path = _save(tmp_path, seed=3, num_labels=1, classifier_pooling=classifier_pooling)
    llm = LLM(path)  # a sequence classifier scores by default
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    pairs = [tokenizer(QUERY, document)["input_ids"] for document in DOCUMENTS]
    logits = [row[0] for row in hf_outputs(path, pairs, classifier=True)]
    raw = llm.score(QUERY, DOCUMENTS, PoolingParams(activation=False))
    assert [o.prompt_token_ids for o in raw] == pairs
    assert max(map(len, pairs)) > 3 * WINDOW
    ours = [o.outputs.score for o in raw]
    delta = np.abs(np.subtract(ours, logits)).max()
    print(f"\nModernBERT {classifier_pooling} cross-encoder logits: max |d| {delta:.2e}")
    np.testing.assert_allclose(ours, logits, atol=2e-5)
    scores = [o.outputs.score for o in llm.score(QUERY, DOCUMENTS)]
    np.testing.assert_allclose(scores, 1 / (1 + np.exp(-np.asarray(logits))), atol=1e-5)
    if classifier_pooling == "cls":  # and as sentence-transformers' CrossEncoder predicts them
        cross_encoder = pytest.importorskip("sentence_transformers").CrossEncoder
        kwargs = {"model_kwargs": {"attn_implementation": "eager"}}
        predicted = cross_encoder(path, device="cpu", **kwargs).predict(
            [(QUERY, d) for d in DOCUMENTS]
        )
        np.testing.assert_allclose(scores, predicted, atol=1e-5)


def test_classifier_probabilities_are_the_softmax_of_its_logits(tmp_path):
    path = _save(tmp_path, seed=4, num_labels=3, classifier_pooling="mean")
    assert_probabilities_are_the_softmax_of_its_logits(path, TEXTS)


def test_the_hub_config_spelling_reads_alike(tmp_path):
    """transformers 4's ``global_attn_every_n_layers`` / ``*_rope_theta`` (what the Hub's
    ModernBERT checkpoints ship) and transformers 5's ``layer_types`` / ``rope_parameters``."""
    written = _config_json(_save(tmp_path, seed=5, num_labels=1, **EMBEDDERS["MEAN"]))
    hub = {k: v for k, v in written.items() if k not in ("layer_types", "rope_parameters")}
    hub.update(global_rope_theta=1000.0, local_rope_theta=50.0, global_attn_every_n_layers=2)
    config = EncoderConfig.from_hf_dict(written)
    assert EncoderConfig.from_hf_dict(hub) == config
    assert config.layer_types == ("full_attention", "sliding_attention", "full_attention")
    assert (config.rope_theta, config.local_rope_theta, config.local_attention) == (1e3, 50, 8)
    assert config.num_labels == 1 and config.checkpoint_prefix == "model."
    assert not config.norm_bias and config.max_sequence_len == 128
    # transformers 4 rotates the local layers with the global base when local_rope_theta is null
    assert EncoderConfig.from_hf_dict({**hub, "local_rope_theta": None}).local_rope_theta == 1e3
    with pytest.raises(ValueError, match="classifier_pooling"):
        EncoderConfig.from_hf_dict({**hub, "classifier_pooling": "max"})
    with pytest.raises(ValueError, match="rope_type 'linear'"):
        EncoderConfig.from_hf_dict({**hub, "rope_scaling": {"rope_type": "linear", "factor": 2}})
    with pytest.raises(ValueError, match="hidden_activation"):
        EncoderConfig.from_hf_dict({**hub, "hidden_activation": "relu6"})
