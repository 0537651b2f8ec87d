"""Shared fixtures: tiny random HF checkpoints (built with transformers, saved locally) and the
embedded default model. Nothing is downloaded."""

from __future__ import annotations

import os

import pytest

# Tests compile for TPU with libtpu (no chip): let test processes load it side by side.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def smollm2_gguf() -> str:
    from jaxgen.loaders.default_model import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_gguf):
    from jaxgen.loaders.tokenizer import load_tokenizer

    return load_tokenizer(smollm2_gguf)


def save_tiny_model(
    path: str, tokenizer, *, arch: str = "llama", seed: int = 0, **overrides
) -> str:
    """Writes a small random HF checkpoint (safetensors) plus the SmolLM2 tokenizer to ``path``."""
    import torch
    import transformers

    torch.manual_seed(seed)
    base = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        rms_norm_eps=1e-5,
    )
    base.update(overrides)
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[arch]
    model = model_cls(config_cls(**base)).eval()
    with torch.no_grad():  # larger weights than the init's 0.02 std make logits informative
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smollm2_tokenizer) -> str:
    """A 2-layer Llama (GQA 4/2, untied) with the SmolLM2 tokenizer."""
    return save_tiny_model(str(tmp_path_factory.mktemp("tiny-llama")), smollm2_tokenizer)


@pytest.fixture(scope="session")
def smollm2_hf(smollm2_gguf):
    """The HF transformers (PyTorch, fp32) reference, dequantised from the same GGUF file."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(smollm2_gguf), gguf_file=os.path.basename(smollm2_gguf), dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="session")
def smollm2_loaded():
    from jaxgen.loaders import load_model

    return load_model(None, dtype="float32")


@pytest.fixture(scope="session")
def smollm2_llm():
    """One paged engine on the default model, shared by the tests that only read from it."""
    from jaxgen import LLM

    return LLM(None, max_model_len=512, kv_cache_memory=256 << 20)
