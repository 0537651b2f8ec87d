"""Fixtures of the loaders' tests: GGUF files holding only a tokenizer (both kinds llama.cpp
writes), trained here."""

from __future__ import annotations

import pytest

from tests.loaders.gguf_tokenizer_files import write_byte_level_gguf, write_sentencepiece_gguf


@pytest.fixture(scope="module")
def byte_level_gguf(tmp_path_factory) -> str:
    """A byte-level BPE vocabulary trained here, written as llama.cpp's ``gpt2`` kind."""
    return write_byte_level_gguf(tmp_path_factory.mktemp("gguf-bpe"))


@pytest.fixture(scope="module")
def sentencepiece_gguf(tmp_path_factory) -> str:
    """A SentencePiece BPE vocabulary with byte fallback, written as llama.cpp's ``llama`` kind."""
    return write_sentencepiece_gguf(tmp_path_factory.mktemp("gguf-spm"))
