"""GGUF's quantised blocks as integer codes times a per-group scale (plus a per-group minimum).

Every type jaxgen keeps dequantises, in ``gguf.quants.dequantize`` (and ggml's own
``dequantize_row_*``), as ``scale * code`` or ``scale * code - offset`` per group of 16 or 32
weights, the scale and offset being float16 numbers or the float32 product of a float16
super-block scale and a small integer sub-block scale. :func:`decode_blocks` splits a tensor's
blocks into those codes, scales and minimums, so that ``codes * scales + mins`` in float32 (a
codebook type's codes read through its ``codebook``) is the file's dequantised tensor bit for bit: every product of a super-block scale (11 significant bits),
a sub-block scale (at most 7 bits) and a code (at most 7 bits) fits float32's 24 bits exactly,
and a minimum is subtracted once, as the dequantiser does. The K-quants' and IQ4_XS's scales stay
two-level, as in the file: the float16 super-block number per 256 weights and a small integer
code per group (``DecodedBlocks.scale_codes`` / ``min_codes``), the product formed where the weight is
used (``QuantizedWeight.group_scales``, the native kernel per panel).

| type | codes | group | scale | minimum | bits a weight (file) |
| --- | --- | --- | --- | --- | --- |
| Q8_0 | int8 q | 32 | d (f16) | | 8.5 (8.5) |
| Q4_0 | u4 q (symmetric: q - 8) | 32 | d (f16) | | 4.5 (4.5) |
| Q4_1 | u4 q | 32 | d (f16) | m (f16) | 5.0 (5.0) |
| Q5_0 | u5 q (symmetric: q - 16) | 32 | d (f16) | | 5.5 (5.5) |
| Q5_1 | u5 q | 32 | d (f16) | m (f16) | 6.0 (6.0) |
| IQ4_NL | u4 q, indices into kvalues | 32 | d (f16) | | 4.5 (4.5) |
| Q2_K | u2 q | 16 | d (f16) x sc (u4) | -dmin (f16) x m (u4) | 2.625 (2.625) |
| Q3_K | u3 q (symmetric: q - 4) | 16 | d (f16) x (sc - 32) (int8) | | 3.5625 (3.4375) |
| Q4_K | u4 q | 32 | d (f16) x sc (int8) | -dmin (f16) x m (int8) | 4.625 (4.5) |
| Q5_K | u5 q | 32 | d (f16) x sc (int8) | -dmin (f16) x m (int8) | 5.625 (5.5) |
| Q6_K | u6 q (symmetric: q - 32) | 16 | d (f16) x sc (int8) | | 6.5625 (6.5625) |
| IQ4_XS | u4 q, indices into kvalues | 32 | d (f16) x (ls - 32) (int8) | | 4.3125 (4.25) |

(``uB``: an unsigned B-bit code, ``DecodedBlocks.kind`` ``"intB"``, which ``QuantizedWeight``
keeps at B bits: int4 two to a byte, 2-, 3-, 5- and 6-bit codes as bit planes packed along K
(``jaxgen.quantization.bit_planes``), as the file splits them; ``kvalues``: llama.cpp's 16-entry
non-linear grid, ``DecodedBlocks.codebook``; ``x``: a float16 number per 256 weights times a code
per group, the product in float32; ``(u4)`` sub-block codes are kept two to a byte
(``DecodedBlocks.scale_code_bits``). The bits over the file's are the 6-bit sub-block codes of
Q3_K / Q4_K / Q5_K and IQ4_XS held in 8.)
"""

from __future__ import annotations

import dataclasses

import numpy as np

SUPER_BLOCK = 256  # elements per K-quant / IQ4_XS super-block
# llama.cpp's non-linear 4-bit codebook (IQ4_NL, IQ4_XS).
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113])
# type -> (elements per block, bytes per block)
BLOCK_LAYOUTS = {
    "Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24),
    "IQ4_NL": (32, 18), "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144),
    "Q5_K": (256, 176), "Q6_K": (256, 210), "IQ4_XS": (256, 136),
}  # fmt: skip
KEPT_TYPES = tuple(BLOCK_LAYOUTS)
CODEBOOK_TYPES = ("IQ4_NL", "IQ4_XS")  # int4 codes index IQ4_VALUES


@dataclasses.dataclass(frozen=True)
class DecodedBlocks:
    """A ``[rows, depth]`` tensor as ``kind`` codes with per-group scales (and minimums), one-
    level or (``scale_codes``) two-level: ``scales`` / ``mins`` one float16 number per row and
    super-block, times an int8 code per group (:meth:`group_scales`)."""

    kind: str  # "int8" (signed codes) or "int2" .. "int6" (unsigned codes of that width)
    codes: np.ndarray  # [rows, depth] int8, or uint8 in 0..2^b - 1 (symmetric: u - 2^(b-1))
    scales: np.ndarray  # [rows, groups] float16, or (two-level) [rows, depth / 256] float16
    mins: np.ndarray | None  # like scales, added after the product; None: none (int4: u - 8)
    group_size: int
    scale_codes: np.ndarray | None = None  # [rows, groups] int8 (two-level), else None
    min_codes: np.ndarray | None = None  # [rows, groups] int8 (two-level mins), else None
    codebook: tuple[int, ...] | None = None  # int4 codes index these 16 numbers, or None
    scale_code_bits: int = 8  # 4: two-level codes in 0..15 (Q2_K), kept two a byte

    def group_scales(self) -> np.ndarray:  # [rows, groups] float16 / float32
        return _per_group(self.scales, self.scale_codes)

    def group_mins(self) -> np.ndarray | None:
        return None if self.mins is None else _per_group(self.mins, self.min_codes)


def _per_group(supers: np.ndarray, codes: np.ndarray | None) -> np.ndarray:
    """``supers`` as they are (one-level), or each group's ``float32(super) * code``."""
    if codes is None:
        return supers
    per_super = codes.shape[1] // supers.shape[1]
    return np.repeat(supers.astype(np.float32), per_super, axis=1) * codes.astype(np.float32)


def decode_blocks(qtype: str, data: np.ndarray, rows: int, depth: int) -> DecodedBlocks:
    """Tensor ``data`` (the file's bytes, ``rows`` rows of ``depth`` elements) of GGUF type
    ``qtype`` (one of ``KEPT_TYPES``) as codes, scales and minimums (module docstring)."""
    if qtype not in BLOCK_LAYOUTS:
        raise ValueError(f"GGUF type {qtype} has no kept layout; kept: {', '.join(KEPT_TYPES)}")
    elements, nbytes = BLOCK_LAYOUTS[qtype]
    if depth % elements:
        raise ValueError(f"a {qtype} row of {depth} elements is not whole {elements}-blocks")
    blocks = np.asarray(data, np.uint8).reshape(rows * depth // elements, nbytes)
    kind, codes, scales, mins, group = _DECODERS[qtype](blocks)
    code_bits = 4 if qtype == "Q2_K" else 8  # its sub-block scales and minimums: 4 bits
    groups = depth // group
    scales, scale_codes = _rows(scales, rows, groups)
    mins, min_codes = (None, None) if mins is None else _rows(mins, rows, groups)
    return DecodedBlocks(
        kind=kind,
        codes=codes.reshape(rows, depth),
        scales=scales,
        mins=mins,
        group_size=group,
        scale_codes=scale_codes,
        min_codes=min_codes,
        codebook=tuple(int(v) for v in IQ4_VALUES) if qtype in CODEBOOK_TYPES else None,
        scale_code_bits=code_bits,
    )


def _rows(scales, rows: int, groups: int):
    """A decoder's scales per row: ``[B, ...]`` one-level ones as ``([rows, groups], None)``,
    a two-level ``(super [B], codes [B, S])`` pair as ``([rows, B / rows], [rows, groups])``."""
    if isinstance(scales, tuple):
        supers, codes = scales
        return supers.reshape(rows, -1), codes.astype(np.int8).reshape(rows, groups)
    return scales.reshape(rows, groups), None


def _half(blocks: np.ndarray, offset: int) -> np.ndarray:  # [B] float16 at byte `offset`
    return blocks[:, offset : offset + 2].copy().view(np.float16)[:, 0]


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """[B, 16 n] bytes -> [B, n, 32] 4-bit codes: each 16 bytes' low nibbles are 16 elements,
    their high nibbles the next 16."""
    packed = packed.reshape(packed.shape[0], -1, 16)
    return np.concatenate([packed & 0x0F, packed >> 4], axis=-1)


def _bits(packed: np.ndarray, count: int, width: int) -> np.ndarray:
    """[B, L] bytes -> [B, count, L] fields: field j of byte l is bits ``width * j`` up."""
    shifts = (np.arange(count, dtype=np.uint8) * width)[None, :, None]
    return (packed[:, None, :] >> shifts) & ((1 << width) - 1)


def _q8_0(b):
    return "int8", b[:, 2:].copy().view(np.int8), _half(b, 0), None, 32


def _q4_0(b):
    return "int4", _nibbles(b[:, 2:]), _half(b, 0), None, 32


def _q4_1(b):
    return "int4", _nibbles(b[:, 4:]), _half(b, 0), _half(b, 2), 32


def _five_bit(b, high_at: int) -> np.ndarray:  # Q5_0 / Q5_1: [B, 32] codes 0..31
    high = b[:, high_at : high_at + 4].copy().view("<u4")  # bit i: element i's fifth bit
    fifth = (high >> np.arange(32, dtype=np.uint32)) & 1
    return _nibbles(b[:, high_at + 4 :]).reshape(-1, 32) | (fifth.astype(np.uint8) << 4)


def _q5_0(b):
    return "int5", _five_bit(b, 2), _half(b, 0), None, 32  # symmetric: q - 16


def _q5_1(b):
    return "int5", _five_bit(b, 4), _half(b, 0), _half(b, 2), 32


def _iq4_nl(b):
    return "int4", _nibbles(b[:, 2:]), _half(b, 0), None, 32  # indices into IQ4_VALUES


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # [B, 8] uint8 each
    """Q4_K / Q5_K's 12 bytes -> 8 six-bit scales and 8 six-bit minimums per super-block: the
    first four of each in the low 6 bits of bytes 0-3 / 4-7, the last four from bytes 8-11's
    nibbles with their top two bits in the top bits of bytes 0-3 / 4-7."""
    low, high, rest = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([low & 63, (rest & 15) | ((low >> 6) << 4)], axis=1)
    mins = np.concatenate([high & 63, (rest >> 4) | ((high >> 6) << 4)], axis=1)
    return scales, mins


def _q4_k(b):
    scales, mins = _k_scales(b[:, 4:16])
    codes = _q4_k_codes(b[:, 16:144])
    return "int4", codes, (_half(b, 0), scales), (-_half(b, 2), mins), 32


def _q4_k_codes(packed):  # [B, 128] -> [B, 8, 32]: 32 bytes' low nibbles, then their high ones
    packed = packed.reshape(-1, 4, 1, 32)
    return np.concatenate([packed & 0x0F, packed >> 4], axis=2).reshape(-1, 8, 32)


def _q5_k(b):
    scales, mins = _k_scales(b[:, 4:16])
    fifth = _bits(b[:, 16:48], 8, 1)  # [B, 8, 32]: bit j of byte l is sub-block j's element l
    codes = _q4_k_codes(b[:, 48:176]) | (fifth << 4)
    return "int5", codes, (_half(b, 0), scales), (-_half(b, 2), mins), 32


def _q6_k(b):
    low = b[:, 0:128].reshape(-1, 2, 1, 64)  # per half: 64 bytes, low nibbles then high
    low = np.concatenate([low & 0x0F, low >> 4], axis=2).reshape(-1, 2, 128)
    high = b[:, 128:192].reshape(-1, 2, 32)  # per half: 2-bit fields j of 32 bytes
    high = np.stack([_bits(half, 4, 2) for half in (high[:, 0], high[:, 1])], axis=1)
    codes = low | (high.reshape(-1, 2, 128) << 4)  # symmetric: q - 32
    sub = b[:, 192:208].copy().view(np.int8)
    return "int6", codes, (_half(b, 208), sub), None, 16


def _q3_k(b):
    low = np.stack([_bits(b[:, 32 + 32 * h : 64 + 32 * h], 4, 2) for h in range(2)], axis=1)
    high = _bits(b[:, 0:32], 8, 1)  # [B, 8, 32]; a clear bit subtracts 4: q - 4 with q's
    codes = low.reshape(-1, 8, 32) | (high << 2)  # third bit from the high mask
    packed = b[:, 96:108]
    sub_low = np.concatenate([packed[:, 0:8] & 15, packed[:, 0:8] >> 4], axis=1)  # [B, 16]
    sub_high = _bits(packed[:, 8:12], 4, 2).reshape(-1, 16)
    sub = (sub_low | (sub_high << 4)).astype(np.int8) - np.int8(32)
    return "int3", codes, (_half(b, 108), sub), None, 16


def _q2_k(b):
    sub = b[:, 0:16]
    codes = np.stack([_bits(b[:, 16 + 32 * h : 48 + 32 * h], 4, 2) for h in range(2)], axis=1)
    scales, mins = (_half(b, 80), sub & 15), (-_half(b, 82), sub >> 4)
    return "int2", codes.reshape(-1, 256), scales, mins, 16


def _iq4_xs(b):
    high = (b[:, 2:4].copy().view("<u2")[:, 0:1] >> (2 * np.arange(8, dtype=np.uint16))) & 3
    low = b[:, 4:8]
    low = np.stack([low & 15, low >> 4], axis=2).reshape(-1, 8)
    sub = (low | (high.astype(np.uint8) << 4)).astype(np.int8) - np.int8(32)
    return "int4", _nibbles(b[:, 8:136]), (_half(b, 0), sub), None, 32  # IQ4_VALUES indices


_DECODERS = {
    "Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1,
    "IQ4_NL": _iq4_nl, "Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k,
    "Q6_K": _q6_k, "IQ4_XS": _iq4_xs,
}  # fmt: skip
