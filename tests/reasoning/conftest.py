"""The reasoning tests' scripted model (``scripted_model``): built once per session."""

from __future__ import annotations

import pytest

from tests.reasoning.scripted_model import save_reasoning_model


@pytest.fixture(scope="session")
def reasoning_model(tmp_path_factory, tiny_model_dir):
    """``(checkpoint directory, tokenizer)`` of the scripted reasoning model."""
    return save_reasoning_model(str(tmp_path_factory.mktemp("reasoning-model")), tiny_model_dir)
