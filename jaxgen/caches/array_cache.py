"""Arrays kept on disk between runs, read back memory-mapped: the work of turning a checkpoint
into the arrays a run uses (a GGUF's quantised tensors, the CPU matmul's packed panels) done
once.

A cache file is ``$JAXGEN_CACHE_DIR/arrays/<kind>-<key>.bin``: a small header (magic, format,
the key's description, each array's name, dtype, shape and byte offset) and the arrays' bytes,
each 64-byte aligned, so a read is one ``np.memmap`` and views over it (no copy, no unpacking).
The key hashes what determines the arrays (the caller's description of its inputs, e.g. a
file's path, size and modification time, with its own format version) and ``FORMAT``.

A file is written whole under a temporary name and renamed into place: a reader sees all of
it or none, and two processes writing the same entry at once each rename a complete file.
A file that cannot be read (torn, truncated, foreign) is a warning and a miss; a directory that
cannot be written is a warning and a run without the cache; ``JAXGEN_ARRAY_CACHE=0`` turns it
off. Neither ever fails a load. Callers cache inputs of ``MIN_BYTES`` and more.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from jaxgen.caches.atomic_file import atomic_write
from jaxgen.caches.compile_cache import cache_root

ENV_SWITCH = "JAXGEN_ARRAY_CACHE"
FORMAT = 1  # bump when the file layout changes
# Inputs smaller than this are converted again rather than cached: cheap to redo, and a test
# suite's many small random weights would fill the directory with entries read never again.
MIN_BYTES = 8 << 20
MAGIC = b"JXGARRAY"
ALIGNMENT = 64
_HEADER_LENGTH = struct.Struct("<Q")
_OFF_VALUES = ("0", "false", "no", "off")


def enabled() -> bool:
    """False when ``JAXGEN_ARRAY_CACHE`` is 0 / false / no / off."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in _OFF_VALUES


def file_key(path: str | os.PathLike) -> dict:
    """What identifies a file's contents without reading them: its real path, size and
    modification time (nanoseconds)."""
    status = os.stat(path)
    return {
        "path": os.path.realpath(path),
        "size": status.st_size,
        "mtime_ns": status.st_mtime_ns,
    }


def content_key(arrays) -> str:
    """A SHA-256 over ``arrays``' dtypes, shapes and bytes (about 0.07 s per 100 MB)."""
    digest = hashlib.sha256()
    for array in arrays:
        array = np.asarray(array, order="C")
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(_bytes(array))
    return digest.hexdigest()


class ArrayCache:
    """One cache entry: ``kind`` (a file-name prefix, e.g. ``"gguf"``) and ``key`` (any
    JSON-serialisable description of what determines the arrays)."""

    def __init__(self, kind: str, key, directory: str | os.PathLike | None = None):
        self.description = json.dumps({"format": FORMAT, "kind": kind, "key": key}, sort_keys=True)
        digest = hashlib.sha256(self.description.encode()).hexdigest()[:32]
        self.directory = Path(directory) if directory is not None else cache_root() / "arrays"
        self.path = self.directory / f"{kind}-{digest}.bin"

    def load(self) -> dict[str, np.ndarray] | None:
        """The entry's arrays (read-only views of one memory map), or None: absent, off, or
        unreadable (then with a warning; the next ``save`` replaces it)."""
        if not enabled() or not self.path.is_file():
            return None
        try:
            return self._read()
        except Exception as error:  # torn, truncated or foreign: a miss
            warnings.warn(
                f"array cache: {self.path} unreadable ({error}); rebuilding it", stacklevel=2
            )
            return None

    def _read(self) -> dict[str, np.ndarray]:
        data = np.memmap(self.path, mode="r").view(np.ndarray)  # views keep the map alive
        prefix = len(MAGIC) + _HEADER_LENGTH.size
        if len(data) < prefix or bytes(data[: len(MAGIC)]) != MAGIC:
            raise ValueError("not an array cache file")
        (header_length,) = _HEADER_LENGTH.unpack(bytes(data[len(MAGIC) : prefix]))
        if prefix + header_length > len(data):
            raise ValueError("truncated header")
        header = json.loads(bytes(data[prefix : prefix + header_length]))
        if header.get("description") != self.description:
            raise ValueError("written for another key")
        start, arrays = _data_start(header_length), {}
        for name, (dtype, shape, offset) in header["arrays"].items():
            offset += start
            dtype = np.dtype(dtype)
            size = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            if offset + size > len(data):
                raise ValueError(f"truncated array {name!r}")
            arrays[name] = data[offset : offset + size].view(dtype).reshape(tuple(shape))
        return arrays

    def save(self, arrays: Mapping[str, np.ndarray]) -> bool:
        """Writes ``arrays`` as the entry (atomically); False, with a warning, when the
        directory cannot be written. Does nothing when the cache is off."""
        if not enabled():
            return False
        arrays = {name: np.asarray(a, order="C") for name, a in arrays.items()}
        index, offset = {}, 0  # offsets from the data's start: the header's end, aligned
        for name, array in arrays.items():
            index[name] = [array.dtype.str, list(array.shape), offset]
            offset += -(-array.nbytes // ALIGNMENT) * ALIGNMENT
        header = json.dumps({"description": self.description, "arrays": index}).encode()
        start = _data_start(len(header))
        try:
            with atomic_write(self.path) as handle:
                handle.write(MAGIC + _HEADER_LENGTH.pack(len(header)) + header)
                for name, array in arrays.items():
                    handle.seek(start + index[name][2])
                    handle.write(_bytes(array))
                handle.truncate()
        except OSError as error:
            warnings.warn(
                f"array cache: cannot write {self.path} ({error.strerror or error}); running "
                f"without it (set JAXGEN_CACHE_DIR to a writable directory or {ENV_SWITCH}=0)",
                stacklevel=2,
            )
            return False
        return True


def _data_start(header_length: int) -> int:
    """Where the arrays start: after the magic, the header's length and the header, aligned."""
    end = len(MAGIC) + _HEADER_LENGTH.size + header_length
    return -(-end // ALIGNMENT) * ALIGNMENT


def _bytes(array: np.ndarray) -> memoryview:
    """A contiguous array's bytes."""
    return memoryview(array.reshape(-1).view(np.uint8))
