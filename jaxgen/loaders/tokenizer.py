"""Tokenizers from a HF checkpoint directory or from a GGUF file's metadata (no torch either way)."""

from __future__ import annotations

import os

from jaxgen.loaders.gguf_tokenizer import gguf_tokenizer


def load_tokenizer(path: str, *, reader=None):
    """A ``transformers`` fast tokenizer for a checkpoint directory or a ``.gguf`` file.

    Args:
        path: a HF directory (``tokenizer.json`` and friends) or a ``.gguf`` file.
        reader: the file's ``gguf.GGUFReader`` when the caller has one (parsing a GGUF takes
            seconds; the tokenizer itself builds in well under one).
    """
    if os.path.isfile(path) and path.endswith(".gguf"):
        if reader is None:
            import gguf  # the reader parses the whole file; only GGUF paths need it

            reader = gguf.GGUFReader(path)
        return gguf_tokenizer(reader)
    from transformers import AutoTokenizer  # transformers' import takes a second; deferred

    return AutoTokenizer.from_pretrained(path)
