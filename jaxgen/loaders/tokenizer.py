"""Tokenizers from a HF checkpoint directory or from a GGUF file's metadata (no torch either way;
no transformers for a GGUF file)."""

from __future__ import annotations

import os

from jaxgen.loaders.gguf_reader import GGUFReader
from jaxgen.loaders.gguf_tokenizer_cache import cached_gguf_tokenizer
from jaxgen.loaders.transformers_import import transformers


def load_tokenizer(path: str, *, reader: GGUFReader | None = None):
    """The tokenizer of a checkpoint directory (a ``transformers`` fast tokenizer) or of a
    ``.gguf`` file (a ``GGUFTokenizer``, tokenizing as llama.cpp: no transformers import; kept in the cache
    directory between runs, ``jaxgen.loaders.gguf_tokenizer_cache``).

    Args:
        path: a HF directory (``tokenizer.json`` and friends) or a ``.gguf`` file.
        reader: the file's ``GGUFReader`` when the caller has one (so the file is read once).
    """
    if os.path.isfile(path) and path.endswith(".gguf"):
        return cached_gguf_tokenizer(path, reader)
    return transformers().AutoTokenizer.from_pretrained(path)
