"""Logits parity with HF transformers (PyTorch, fp32): tiny random configs and the SmolLM2 GGUF."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from jaxgen.evaluation.full_forward import full_sequence_logits
from jaxgen.loaders import load_model
from tests.family_models import save_tiny_model

TINY_VARIANTS = {
    "llama-gqa-untied": dict(arch="llama"),
    "llama-mha-tied": dict(arch="llama", num_key_value_heads=4, tie_word_embeddings=True),
    "llama-mqa": dict(arch="llama", num_key_value_heads=1),
    "llama-bias": dict(arch="llama", attention_bias=True),
    "llama3-rope": dict(
        arch="llama",
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "llama-linear-rope": dict(arch="llama", rope_scaling={"rope_type": "linear", "factor": 4.0}),
    "llama-head-dim": dict(arch="llama", head_dim=32),
    "qwen2-qkv-bias": dict(arch="qwen2"),
    "mistral": dict(arch="mistral", sliding_window=None),
}


def hf_logits(model, token_ids):
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].float().numpy()


# The default suite runs three variants; the others run with -m slow.
TINY_FAST = ("llama-gqa-untied", "llama-mha-tied", "llama3-rope")


@pytest.mark.parametrize(
    "variant",
    [
        v if v in TINY_FAST else pytest.param(v, marks=pytest.mark.slow)
        for v in sorted(TINY_VARIANTS)
    ],
)
def test_tiny_model_logits_match_transformers(variant, tmp_path, smollm2_tokenizer):
    import transformers

    spec = dict(TINY_VARIANTS[variant])
    path = save_tiny_model(str(tmp_path), smollm2_tokenizer, **spec)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    loaded = load_model(path)
    rng = np.random.default_rng(0)
    for length in (1, 7, 16, 17, 70):
        ids = rng.integers(0, loaded.config.vocab_size, length).tolist()
        ours = full_sequence_logits(loaded, ids)
        ref = hf_logits(hf, ids)
        assert np.abs(ours - ref).max() <= 1e-3, (variant, length, np.abs(ours - ref).max())


@pytest.mark.parametrize(
    "length",
    [pytest.param(5, marks=pytest.mark.slow), 33, pytest.param(100, marks=pytest.mark.slow)],
)
def test_smollm2_gguf_logits_match_transformers(
    length, smollm2_loaded, smollm2_hf, smollm2_tokenizer
):
    text = "Paged attention stores keys and values in fixed-size pages. " * 20
    ids = smollm2_tokenizer.encode(text)[:length]
    assert len(ids) == length
    ours = full_sequence_logits(smollm2_loaded, ids)
    ref = hf_logits(smollm2_hf, ids)
    diff = np.abs(ours - ref).max()
    assert diff <= 1e-3, diff


def test_smollm2_config_from_gguf(smollm2_loaded):
    cfg = smollm2_loaded.config
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (30, 9, 3, 64)
    assert cfg.tie_word_embeddings and cfg.vocab_size == 49152
    assert 2 in cfg.eos_token_ids
