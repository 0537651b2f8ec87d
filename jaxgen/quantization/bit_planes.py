"""Integer codes of 2, 3, 5 and 6 bits held at their own width: bit planes packed along K.

GGUF keeps a 5- or 6-bit code as a 4-bit part and a 1- or 2-bit part in separate arrays (``ql``
/ ``qh``), a 3-bit one as 2 bits and 1 (``qs`` / ``hmask``). ``QuantizedWeight``'s kinds
``int2``, ``int3``, ``int5`` and ``int6`` keep them the same way, as unsigned codes ``u`` split
into planes from the low bits up; ``values`` is uint8 ``[K * bits / 8, N]``, each 8 rows of a
column (a block) taking ``bits`` consecutive bytes: the low plane's, then the high plane's. A
plane ``w`` bits wide holds the block in ``w`` bytes, byte ``j`` holding row ``(8 / w) j + i``
of the block in bits ``w i`` up:

| kind | planes (low first) | bytes per 8 rows | code |
| --- | --- | --- | --- |
| ``int2`` | 2 | 2 | ``u`` in 0..3 |
| ``int3`` | 2, 1 | 3 | ``u`` in 0..7 |
| ``int4`` | 4 | 4 | ``u`` in 0..15 (``QuantizedWeight``'s int4 layout: row ``2i`` low nibble) |
| ``int5`` | 4, 1 | 5 | ``u`` in 0..31 |
| ``int6`` | 4, 2 | 6 | ``u`` in 0..63 |

So a block never straddles two devices when K is split at multiples of 8 rows, and splitting
columns is free. The weight is ``scale * (u - 2 ** (bits - 1))`` per group (symmetric, as int4's
``u - 8``), or ``scale * u + min`` with minimums. :func:`unpack_planes` undoes the packing with
shifts and masks (jnp inside a jitted dequantisation, which XLA fuses into the dot's operand;
numpy on the host). :func:`widen` turns such a weight into the int8 / int4 layout that
consumers of numbers read (the "cpu" backend's panels, the streamed TPU kernel, the row-major
embedding table), with the same dequantisation. Two-level ``scale_codes`` / ``min_codes`` of
4 bits (GGUF's Q2_K) are held two to a byte the same way (uint8 ``[K / group_size / 2, N]``,
group ``2i`` in the low nibble: :func:`unpack_scale_codes`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

BLOCK_ROWS = 8  # rows of a column whose planes lie together (bits bytes)
PLANES = {"int2": (2,), "int3": (2, 1), "int4": (4,), "int5": (4, 1), "int6": (4, 2)}
PLANE_KINDS = ("int2", "int3", "int5", "int6")  # QuantizedWeight's kinds held as bit planes
CODE_BITS = {kind: sum(widths) for kind, widths in PLANES.items()}
WIDENED_KINDS = {"int2": "int4", "int3": "int4", "int5": "int8", "int6": "int8"}


def _xp(array):
    return np if isinstance(array, np.ndarray) else jnp


def pack_planes(codes: np.ndarray, kind: str) -> np.ndarray:  # [K, N] -> [K * bits / 8, N]
    """Unsigned ``kind`` codes (each below ``2 ** bits``) as planes (module docstring); K a
    multiple of 8."""
    codes = np.asarray(codes, np.uint8)
    depth, columns = codes.shape
    if depth % BLOCK_ROWS:
        raise ValueError(f"{kind} codes need K a multiple of {BLOCK_ROWS}, got {depth}")
    blocks = codes.reshape(depth // BLOCK_ROWS, BLOCK_ROWS, columns)
    parts, shift = [], 0
    for width in PLANES[kind]:
        per_byte = BLOCK_ROWS // width
        fields = ((blocks >> shift) & ((1 << width) - 1)).reshape(-1, width, per_byte, columns)
        packed = np.zeros(fields.shape[:2] + (columns,), np.uint8)
        for i in range(per_byte):
            packed |= fields[:, :, i] << (width * i)
        parts.append(packed)
        shift += width
    return np.concatenate(parts, axis=1).reshape(-1, columns)


def unpack_planes(values, kind: str, depth: int, columns: int):  # [K * bits / 8, N] -> [K, N]
    """``kind``'s unsigned codes (uint8) from its planes: jnp for jax arrays, numpy for numpy."""
    xp = _xp(values)
    blocks = values.reshape(depth // BLOCK_ROWS, CODE_BITS[kind], columns)
    codes, offset, shift = None, 0, 0
    for width in PLANES[kind]:
        per_byte = BLOCK_ROWS // width
        shifts = xp.asarray(np.arange(per_byte, dtype=np.uint8) * width)[None, None, :, None]
        part = blocks[:, offset : offset + width, None, :]  # [B, w, 1, N]
        fields = ((part >> shifts) & ((1 << width) - 1)).reshape(-1, BLOCK_ROWS, columns)
        fields = fields << shift if shift else fields
        codes = fields if codes is None else codes | fields
        offset += width
        shift += width
    return codes.reshape(depth, columns)


def unpack_scale_codes(codes):  # [G, N] int8 as they are, or [G / 2, N] uint8 -> [G, N] int8
    """Two-level codes as int8 per group: 4-bit ones (uint8, two a byte) unpacked."""
    if codes is None or np.dtype(codes.dtype) != np.uint8:
        return codes
    rows, columns = codes.shape
    return unpack_planes(codes, "int4", 2 * rows, columns).astype(_xp(codes).int8)


def packed_rows(kind: str, depth: int) -> int:
    """Rows of ``values`` for a ``kind`` weight of input width ``depth``."""
    return depth * CODE_BITS[kind] // BLOCK_ROWS


def widen(weight):
    """A ``QuantizedWeight`` whose codes are bit planes or whose two-level codes are 4 bits as
    the same weight in the int8 / int4 layout (``WIDENED_KINDS``; int8 two-level codes); others
    as they are. Arrays or ``jax.ShapeDtypeStruct``s (the layout alone)."""
    codes_packed = [
        getattr(weight, name) is not None and np.dtype(getattr(weight, name).dtype) == np.uint8
        for name in ("scale_codes", "min_codes")
    ]
    if weight.kind not in PLANE_KINDS and not any(codes_packed):
        return weight
    changes = {}
    for name, packed in zip(("scale_codes", "min_codes"), codes_packed, strict=True):
        if packed:
            changes[name] = _widened_leaf(getattr(weight, name), unpack_scale_codes, 2, np.int8)
    if weight.kind in PLANE_KINDS:
        target = WIDENED_KINDS[weight.kind]
        depth, columns = weight.shape

        def numbers(values):
            return _widened_codes(values, weight.kind, target, weight.mins is None, weight.shape)

        rows = depth // 2 if target == "int4" else depth
        dtype = np.uint8 if target == "int4" else np.int8
        changes["values"] = _widened_leaf(weight.values, numbers, None, dtype, (rows, columns))
        changes["kind"] = target
    return dataclasses.replace(weight, **changes)


def _widened_codes(values, kind: str, target: str, symmetric: bool, shape):
    """``kind`` planes as ``target`` codes of the same numbers (int4: ``u + 8 - 2 ** (b - 1)``
    two a byte when symmetric; int8: ``u - 2 ** (b - 1)``, or ``u`` with minimums)."""
    xp = _xp(values)
    unsigned = unpack_planes(values, kind, *shape)
    half = 1 << (CODE_BITS[kind] - 1)
    if target == "int8":
        return unsigned.astype(xp.int8) - xp.int8(half) if symmetric else unsigned.astype(xp.int8)
    if symmetric:
        unsigned = unsigned + xp.uint8(8 - half)
    return unsigned[0::2] | (unsigned[1::2] << 4)


def _widened_leaf(leaf, convert, row_factor, dtype, shape=None):
    """``convert(leaf)``, or for a ``ShapeDtypeStruct`` one of ``shape`` (or ``row_factor`` x
    its rows) in ``dtype`` with its sharding."""
    if isinstance(leaf, jax.ShapeDtypeStruct):
        shape = shape or (leaf.shape[0] * row_factor, *leaf.shape[1:])
        return jax.ShapeDtypeStruct(shape, dtype, sharding=getattr(leaf, "sharding", None))
    return convert(leaf)
