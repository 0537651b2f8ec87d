"""A GGUF file's tokenizer fields kept on disk between runs.

A GGUF tokenizer is built from the file's ``tokenizer.*`` metadata (``gguf_tokenizer``). Reading
those fields means scanning the file's header, tens of thousands of strings; the cache keeps
them as one JSON document instead, ``$JAXGEN_CACHE_DIR/tokenizers/gguf-<key>.json``: a line
with the key's description, then the fields. The key is the file's real path, size and
modification time and ``FORMAT``.

As ``jaxgen.caches.array_cache``: written whole (``atomic_write``), an entry that cannot be read
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

from jaxgen.caches import array_cache
from jaxgen.caches.array_cache import file_key
from jaxgen.caches.atomic_file import atomic_write
from jaxgen.caches.compile_cache import cache_root
from jaxgen.loaders.gguf_reader import GGUFReader
from jaxgen.loaders.gguf_tokenizer import GGUFTokenizer, gguf_tokenizer

# Bump when what an entry holds, or how ``gguf_tokenizer`` reads it, changes.
FORMAT = 2


class GGUFTokenizerCache:
    """The cache entry of the GGUF file at ``path``'s tokenizer."""

    def __init__(self, path: str | os.PathLike, directory: str | os.PathLike | None = None):
        key = file_key(path)
        self.description = json.dumps({"file": key, "format": FORMAT}, sort_keys=True)
        digest = hashlib.sha256(self.description.encode()).hexdigest()[:32]
        directory = cache_root() / "tokenizers" if directory is None else directory
        self.path = os.path.join(directory, f"gguf-{digest}.json")
        self.used = array_cache.enabled() and key["size"] >= array_cache.MIN_BYTES

    def load(self) -> GGUFTokenizer | None:
        """The stored tokenizer, or None: absent, off, or unreadable (then with a warning)."""
        if not self.used or not os.path.isfile(self.path):
            return None
        try:
            with open(self.path, encoding="utf-8") as handle:
                header = json.loads(handle.readline())
                if header.get("description") != self.description:
                    raise ValueError("written for another key")
                fields = json.loads(handle.read())
            return gguf_tokenizer(fields)
        except Exception as error:  # torn, truncated or foreign: a miss
            warnings.warn(
                f"tokenizer cache: {self.path} unreadable ({error}); rebuilding it", stacklevel=2
            )
            return None

    def save(self, tokenizer: GGUFTokenizer) -> bool:
        """Writes ``tokenizer``'s fields as the entry (atomically); False, with a warning, when
        the directory cannot be written. Does nothing when the cache is off."""
        if not self.used:
            return False
        header = json.dumps({"description": self.description})
        try:
            with atomic_write(Path(self.path)) as handle:
                handle.write(header.encode() + b"\n")
                handle.write(json.dumps(tokenizer.metadata, ensure_ascii=False).encode())
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
) -> GGUFTokenizer:
    """The tokenizer of the GGUF file at ``path``: built from its cache entry's fields, else
    from the file's (``reader``'s when given), which are then stored for the next run."""
    cache = GGUFTokenizerCache(path)
    tokenizer = cache.load()
    if tokenizer is None:
        tokenizer = gguf_tokenizer((reader or GGUFReader(path)).fields)
        cache.save(tokenizer)
    return tokenizer
