"""A GGUF file's tokenizer kept on disk between runs.

Building the ``tokenizers`` pipeline from a GGUF's metadata (decoding 49k tokens and 49k merges
from the file, respelling the vocabulary, the BPE model, the marked tokens) costs ~0.3 s for the
default model on a CPU, every run; reading the built pipeline back (``Tokenizer.from_str``) about
half that, and the vocabulary is then never decoded from the file. An entry is
``$JAXGEN_CACHE_DIR/tokenizers/gguf-<key>.json``: one line of JSON (the key's description and
``PlainTokenizer``'s options), then the pipeline as ``Tokenizer.to_str`` writes it. The key is
the file's real path, size and modification time, ``FORMAT`` and the ``tokenizers`` version.

As ``jaxgen.config.array_cache``: written whole (``atomic_write``), an entry that cannot be read
is a warning and a miss, a directory that cannot be written a warning and a run without the
cache, ``JAXGEN_ARRAY_CACHE=0`` turns it off, files under ``array_cache.MIN_BYTES`` are not
cached.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer

from jaxgen.config import array_cache
from jaxgen.config.array_cache import file_key
from jaxgen.config.atomic_file import atomic_write
from jaxgen.config.compile_cache import cache_root
from jaxgen.loaders.gguf_reader import GGUFReader
from jaxgen.loaders.gguf_tokenizer import gguf_tokenizer
from jaxgen.loaders.plain_tokenizer import PlainTokenizer

# Bump when ``gguf_tokenizer``'s output for the same file changes.
FORMAT = 1


class GGUFTokenizerCache:
    """The cache entry of the GGUF file at ``path``'s tokenizer."""

    def __init__(self, path: str | os.PathLike, directory: str | os.PathLike | None = None):
        key = file_key(path)
        self.description = json.dumps(
            {"file": key, "format": FORMAT, "tokenizers": tokenizers.__version__}, sort_keys=True
        )
        digest = hashlib.sha256(self.description.encode()).hexdigest()[:32]
        directory = cache_root() / "tokenizers" if directory is None else directory
        self.path = os.path.join(directory, f"gguf-{digest}.json")
        self.used = array_cache.enabled() and key["size"] >= array_cache.MIN_BYTES

    def load(self) -> PlainTokenizer | None:
        """The stored tokenizer, or None: absent, off, or unreadable (then with a warning)."""
        if not self.used or not os.path.isfile(self.path):
            return None
        try:
            with open(self.path, encoding="utf-8") as handle:
                header = json.loads(handle.readline())
                if header.get("description") != self.description:
                    raise ValueError("written for another key")
                backend = Tokenizer.from_str(handle.read())
            return PlainTokenizer(backend, **header["options"])
        except Exception as error:  # torn, truncated or foreign: a miss
            warnings.warn(
                f"tokenizer cache: {self.path} unreadable ({error}); rebuilding it", stacklevel=2
            )
            return None

    def save(self, tokenizer: PlainTokenizer) -> bool:
        """Writes ``tokenizer`` as the entry (atomically); False, with a warning, when the
        directory cannot be written. Does nothing when the cache is off."""
        if not self.used:
            return False
        options = {
            **tokenizer.special_tokens_map,
            "add_bos_token": tokenizer.add_bos_token,
            "add_eos_token": tokenizer.add_eos_token,
            "chat_template": tokenizer.chat_template,
        }
        header = json.dumps({"description": self.description, "options": options})
        try:
            with atomic_write(Path(self.path)) as handle:
                handle.write(header.encode() + b"\n")
                handle.write(tokenizer.backend_tokenizer.to_str().encode())
        except OSError as error:
            warnings.warn(
                f"tokenizer cache: cannot write {self.path} ({error.strerror or error}); running "
                f"without it (set JAXGEN_CACHE_DIR to a writable directory or "
                f"{array_cache.ENV_SWITCH}=0)",
                stacklevel=2,
            )
            return False
        return True


def cached_gguf_tokenizer(
    path: str | os.PathLike, reader: GGUFReader | None = None
) -> PlainTokenizer:
    """The tokenizer of the GGUF file at ``path``: read from its cache entry, else built
    (``gguf_tokenizer``, from ``reader``'s fields when given) and stored there for the next
    run."""
    cache = GGUFTokenizerCache(path)
    tokenizer = cache.load()
    if tokenizer is None:
        tokenizer = gguf_tokenizer((reader or GGUFReader(path)).fields)
        cache.save(tokenizer)
    return tokenizer
