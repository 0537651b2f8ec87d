"""A GGUF file's metadata and tensor table, read in bulk from a memory map.

``gguf.GGUFReader`` makes one numpy view per value, so a vocabulary of 49k tokens and 49k merges
costs ~150k Python objects and seconds; here scalars are unpacked with ``struct``, numeric arrays
are one ``np.frombuffer`` view and string arrays one pass over the bytes, decoded when first
read (a run whose tokenizer comes from ``gguf_tokenizer_cache`` never decodes the vocabulary).
Tensors are views over the same memory map, shaped as ``gguf.GGUFReader`` shapes them (quantised
types as bytes per row).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Mapping
from typing import NamedTuple

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
# GGUF value type -> struct format of a scalar (little-endian).
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip
# GGUF value type -> numpy dtype of an array of it.
_ARRAY_DTYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}  # fmt: skip
# Float and integer tensor types -> numpy dtype of their elements (others are bytes).
_TENSOR_DTYPES = {
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


class TensorInfo(NamedTuple):
    """One tensor of the file (the fields of ``gguf.ReaderTensor`` the loader reads)."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: np.ndarray  # ggml order: innermost dimension first
    n_elements: int
    n_bytes: int
    data_offset: int
    data: np.ndarray  # a view of the memory map


class _Strings(NamedTuple):
    """A string array not decoded yet: where its first length is, and how many strings."""

    offset: int
    count: int


class GGUFFields(Mapping):
    """The metadata fields (key -> value); string arrays are decoded at their first read."""

    def __init__(self, reader: GGUFReader):
        self._reader = reader
        self._values: dict[str, object] = {}

    def __getitem__(self, key: str):
        value = self._values[key]
        if isinstance(value, _Strings):
            value = self._values[key] = self._reader._decode_strings(*value)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


class GGUFReader:
    """``fields`` (key -> Python value: str, int, float, bool or a list of them) and ``tensors``
    (``TensorInfo``s, in file order) of a little-endian GGUF v2/v3 file.

    Raises:
        ValueError: not a GGUF file, an unsupported version, or truncated / inconsistent.
    """

    def __init__(self, path: str | os.PathLike):
        self.data = np.memmap(path, mode="r")
        self._buffer = memoryview(self.data)
        self._offset = 0
        if bytes(self._take(4)) != MAGIC:
            raise ValueError("not a GGUF file (bad magic)")
        version = self._scalar(4)
        if version not in SUPPORTED_VERSIONS:
            raise ValueError(f"GGUF version {version} is not supported ({SUPPORTED_VERSIONS})")
        tensor_count, field_count = self._scalar(10), self._scalar(10)
        self.fields = GGUFFields(self)
        for _ in range(field_count):
            key = self._string()
            self.fields._values[key] = self._value(self._scalar(4), top_level=True)
        infos = [self._tensor_info() for _ in range(tensor_count)]
        alignment = self.fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"invalid general.alignment {alignment!r}")
        self.data_offset = -(-self._offset // alignment) * alignment
        self.tensors = [self._tensor(*info) for info in infos]

    # -- metadata ------------------------------------------------------------------------------
    def _take(self, size: int) -> memoryview:
        start, end = self._offset, self._offset + size
        if end > len(self._buffer):
            raise ValueError("GGUF file is truncated")
        self._offset = end
        return self._buffer[start:end]

    def _scalar(self, value_type: int):
        fmt = _SCALARS.get(value_type)
        if fmt is None:
            raise ValueError(f"unknown GGUF value type {value_type}")
        return struct.unpack(fmt, self._take(struct.calcsize(fmt)))[0]

    def _string(self) -> str:
        return str(self._take(self._scalar(10)), "utf-8")

    def _value(self, value_type: int, *, top_level: bool = False):
        if value_type == STRING:
            return self._string()
        if value_type != ARRAY:
            return self._scalar(value_type)
        item_type, count = self._scalar(4), self._scalar(10)
        if item_type == STRING:
            if top_level:  # decoded when read (GGUFFields)
                strings = _Strings(self._offset, count)
                self._offset = self._skip_strings(self._offset, count)
                return strings
            return self._decode_strings(self._offset, count)
        if item_type == ARRAY:
            return [self._value(self._scalar(4)) for _ in range(count)]
        dtype = np.dtype(_ARRAY_DTYPES.get(item_type) or self._unknown(item_type))
        values = np.frombuffer(self._take(count * dtype.itemsize), dtype)
        return values.tolist()

    def _skip_strings(self, offset: int, count: int) -> int:
        """Where ``count`` strings (each a uint64 length, then UTF-8 bytes) from ``offset`` end."""
        buffer, end = self._buffer, len(self._buffer)
        unpack_length = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if offset + 8 > end:
                raise ValueError("GGUF file is truncated")
            (length,) = unpack_length(buffer, offset)
            offset += 8 + length
            if offset > end:
                raise ValueError("GGUF file is truncated")
        return offset

    def _decode_strings(self, offset: int, count: int) -> list[str]:
        """``count`` strings from ``offset`` in one pass (the bounds were checked by a skip, or
        are checked here: ``_offset`` moves past them)."""
        buffer, end = self._buffer, len(self._buffer)
        unpack_length = struct.Struct("<Q").unpack_from
        strings = []
        append = strings.append
        for _ in range(count):
            if offset + 8 > end:
                raise ValueError("GGUF file is truncated")
            (length,) = unpack_length(buffer, offset)
            offset += 8
            if offset + length > end:
                raise ValueError("GGUF file is truncated")
            append(str(buffer[offset : offset + length], "utf-8"))
            offset += length
        self._offset = max(self._offset, offset)
        return strings

    @staticmethod
    def _unknown(value_type: int):
        raise ValueError(f"unknown GGUF value type {value_type}")

    # -- tensors -------------------------------------------------------------------------------
    def _tensor_info(self) -> tuple[str, np.ndarray, int, int]:
        name = self._string()
        n_dims = self._scalar(4)
        dims = np.frombuffer(self._take(8 * n_dims), "<u8").copy()
        return name, dims, self._scalar(4), self._scalar(10)

    def _tensor(self, name: str, dims: np.ndarray, raw_type: int, offset: int) -> TensorInfo:
        try:
            tensor_type = GGMLQuantizationType(raw_type)
        except ValueError:
            raise ValueError(f"tensor {name!r} has unknown GGML type {raw_type}") from None
        n_elements = int(np.prod(dims))
        block_size, type_size = GGML_QUANT_SIZES[tensor_type]
        n_bytes = n_elements * type_size // block_size
        shape = tuple(reversed(dims.tolist()))
        start = self.data_offset + offset
        if start + n_bytes > len(self.data):
            raise ValueError(f"GGUF file is truncated (tensor {name!r})")
        dtype = _TENSOR_DTYPES.get(tensor_type)
        if dtype is None:
            shape = quant_shape_to_byte_shape(shape, tensor_type)
            data = self.data[start : start + n_bytes]
        else:
            data = self.data[start : start + n_bytes].view(dtype)
        return TensorInfo(name, tensor_type, dims, n_elements, n_bytes, start, data.reshape(shape))
