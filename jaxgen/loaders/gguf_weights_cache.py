"""A GGUF file's quantised tensors as ``QuantizedWeight``s, kept on disk between runs.

Converting a GGUF's blocks to ``QuantizedWeight``s (splitting codes from scales, unpacking
and repacking nibbles and bit fields, undoing llama.cpp's rotary permutation) costs about half a
second for the 135M default model on a CPU, every run. The converted arrays are kept in a ``jaxgen.caches.array_cache`` entry keyed by the file's real path,
size and modification time and by ``CONVERSION_FORMAT``, and read back as memory-mapped views
(files under ``array_cache.MIN_BYTES`` are converted every time).
"""

from __future__ import annotations

import numpy as np

from jaxgen.caches import array_cache
from jaxgen.caches.array_cache import ArrayCache, file_key
from jaxgen.quantization import QuantizedWeight
from jaxgen.quantization.quantized_weight import ACTIVATIONS, KINDS

# Bump when ``GGUFFile.get_quantized``'s output for the same file changes.
# 2: K-quants and IQ4 kept exactly (gguf_blocks); 3: two-level scales, IQ4's 4-bit indices;
# 4: 2-, 3-, 5- and 6-bit codes as bit planes, Q2_K's 4-bit sub-block codes two a byte
CONVERSION_FORMAT = 4
_FIELDS = ("values", "scales", "mins", "scale_codes", "min_codes")


class GGUFWeightsCache:
    """The converted quantised tensors of the GGUF file at ``path``: ``get`` from the cache
    entry, ``record`` what was converted instead, ``save`` it for the next run."""

    def __init__(self, path: str):
        key = file_key(path)
        self._entry = ArrayCache("gguf", {"file": key, "format": CONVERSION_FORMAT})
        self._used = key["size"] >= array_cache.MIN_BYTES
        self._stored: dict[str, np.ndarray] | None = None  # read at the first get
        self._converted: dict[str, np.ndarray] = {}

    def get(self, name: str) -> QuantizedWeight | None:
        """Tensor ``name`` as stored in the entry, or None when it holds no such tensor."""
        if self._stored is None:
            self._stored = (self._entry.load() if self._used else None) or {}
        meta = self._stored.get(f"{name}/meta")
        if meta is None:
            return None
        kind, group_size, depth, columns, activations = (int(x) for x in meta)
        codebook = self._stored.get(f"{name}/codebook")
        return QuantizedWeight(
            **{field: self._stored.get(f"{name}/{field}") for field in _FIELDS},
            kind=KINDS[kind],
            group_size=group_size,
            shape=(depth, columns),
            activations=ACTIVATIONS[activations],
            codebook=None if codebook is None else tuple(int(v) for v in codebook),
        )

    def record(self, name: str, weight: QuantizedWeight) -> None:
        """Keeps ``weight`` (numpy leaves) to write at ``save``."""
        depth, columns = weight.shape
        self._converted[f"{name}/meta"] = np.array(
            [
                KINDS.index(weight.kind),
                weight.group_size,
                depth,
                columns,
                ACTIVATIONS.index(weight.activations),
            ],
            np.int64,
        )
        if weight.codebook is not None:
            self._converted[f"{name}/codebook"] = np.array(weight.codebook, np.int64)
        for field in _FIELDS:
            leaf = getattr(weight, field)
            if leaf is not None:
                self._converted[f"{name}/{field}"] = np.asarray(leaf)

    def save(self) -> None:
        """Writes the entry when tensors were converted this run (with those read from it);
        a directory that cannot be written is a warning (``ArrayCache.save``)."""
        if not self._converted or not self._used:
            return
        self._entry.save({**(self._stored or {}), **self._converted})
        self._converted = {}
