"""The parallel tests' checkpoints: tiny Llamas whose head counts split over 8 devices."""

from __future__ import annotations

import pytest

from tests.family_models import save_tiny_model


@pytest.fixture(scope="module")
def mha_dir(tmp_path_factory, smollm2_tokenizer) -> str:
    """8 query and 8 KV heads: every degree up to 8 splits both."""
    path = str(tmp_path_factory.mktemp("tiny-mha8"))
    return save_tiny_model(path, smollm2_tokenizer, num_attention_heads=8, num_key_value_heads=8)
