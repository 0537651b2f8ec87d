"""GGUF files (llama.cpp's format): config, tensors, tokenizer (read by ``gguf_reader``; the
``gguf`` package dequantises).

Tensors come out under Hugging Face names, with what llama.cpp's converter changes undone: for
``llama`` it permutes Q and K rows into an interleaved rotary layout (we restore rotate-half, for
quantised tensors on their codes and scales alike); for Falcon it reorders the fused QKV rows
from per-KV-head groups to all queries, all keys, all values (we restore the groups); for Gemma
it stores every norm weight plus one (we subtract it); and it renames tensors per architecture
(each family's module in ``jaxgen.families`` says what its converter does, and undoes it).

``get_tensor`` dequantises any tensor to float32 (``quantization="none"``). ``get_quantized``
keeps a quantised 2-D tensor quantised, as a ``QuantizedWeight`` in kernel orientation
``[in, out]`` whose dequantisation is the file's, bit for bit: every kept type (Q8_0, Q4_0,
Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) is integer codes times a scale
(plus a minimum) per group of 16 or 32 weights (``jaxgen.loaders.gguf_blocks`` has the table):
codes at the file's width (int8, int4, and 2-, 3-, 5- and 6-bit codes as bit planes packed along
K, ``jaxgen.quantization.bit_planes``), float16 scales where the file's are float16, and
two-level ones where they are a float16 super-block scale times a 4- or 6-bit sub-block scale
(the float16 number per 256 weights and a code per group, as the file has them: 4-bit ones two
a byte, 6-bit ones in an int8; the product, exact in float32, is formed where the weight is
used); IQ4_NL / IQ4_XS keep their 4-bit indices into llama.cpp's 16-entry grid
(``QuantizedWeight.codebook``). Memory is the file's for Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 /
IQ4_NL / Q2_K / Q6_K and within 0.125 bits a weight of it for Q3_K, Q4_K, Q5_K and IQ4_XS (their
6-bit sub-block codes held in 8: 3.5625, 4.625, 5.625 and 4.3125 against 3.4375, 4.5, 5.5 and
4.25).
Stacked expert tensors are dequantised to float32 (exact, 32 bits a weight). A file holding any other type (IQ2_XXS, IQ3_S, TQ1_0, Q8_1, ...) is a
``ValueError`` naming the type and the tensor when it is opened, before any tensor is read.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import numpy as np

from jaxgen.families import family_of_gguf
from jaxgen.loaders.gguf_blocks import BLOCK_LAYOUTS, KEPT_TYPES, DecodedBlocks, decode_blocks
from jaxgen.loaders.gguf_reader import GGUFReader
from jaxgen.loaders.gguf_weights_cache import GGUFWeightsCache
from jaxgen.quantization import QuantizedWeight, pack_int4
from jaxgen.quantization.bit_planes import PLANE_KINDS, pack_planes

FLOAT_TYPES = ("F32", "F16", "BF16")
SUPPORTED_QUANT_TYPES = (*FLOAT_TYPES, *KEPT_TYPES)  # KEPT_TYPES: kept exactly by get_quantized


class GGUFFile:
    """An opened GGUF file: metadata fields and lazily dequantised tensors under HF names."""

    def __init__(self, path: str):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"GGUF file not found: {path!r}")
        try:
            self.reader = GGUFReader(path)
        except Exception as e:
            raise ValueError(
                f"cannot read GGUF file {path!r} (truncated or corrupt?): {e}"
            ) from None
        self.path = path
        self.architecture = self.field("general.architecture")
        self.family = family_of_gguf(self)  # ValueError for an architecture none registers
        _check_tensor_types(self.reader.tensors, path)
        self.tensors = {}  # HF name -> (GGUF tensor, expert index or None)
        self.gguf_names = gguf_names = {tensor.name for tensor in self.reader.tensors}
        expert_names = self.family.gguf_expert_names
        for tensor in self.reader.tensors:
            # ggml order: the experts are the outermost axis, listed last.
            experts = expert_names and expert_names(tensor.name, int(tensor.shape[-1]))
            if experts:
                for expert, name in enumerate(experts):
                    self.tensors[name] = (tensor, expert)
                continue
            name = self.family.gguf_tensor_name(tensor.name, gguf_names)
            self.tensors[name] = (tensor, None)
        self._stacked_cache: tuple[str, np.ndarray] | None = None
        self.weights_cache: GGUFWeightsCache | None = None  # opened at the first get_quantized

    def field(self, key: str, default=None):
        return self.reader.fields.get(key, default)

    def arch_field(self, key: str, default=None):
        """The architecture's field ``key`` (``attention.head_count`` reads
        ``{general.architecture}.attention.head_count``)."""
        return self.field(f"{self.architecture}.{key}", default)

    def vocab_size(self) -> int:
        return self.arch_field("vocab_size") or len(self.field("tokenizer.ggml.tokens", []))

    def hf_config(self) -> dict:
        """A HF ``config.json``-style dictionary from the GGUF metadata (the family's
        ``gguf_config``)."""
        return self.family.gguf_hf_config(self)

    def get_tensor(self, name: str) -> np.ndarray:
        """Dequantised float32 tensor in HF layout (``[out, in]`` for linear weights)."""
        import gguf

        if name not in self.tensors:
            raise ValueError(f"GGUF file {self.path!r} has no tensor for {name!r}")
        tensor, expert = self.tensors[name]
        if expert is not None:
            return self._stacked(tensor)[expert]
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        shape = tuple(int(d) for d in reversed(tensor.shape))  # ggml order is innermost first
        array = self._unpermute(name, np.asarray(data, dtype=np.float32).reshape(shape))
        offset = self.family.gguf_norm_offset  # Gemma's converter stores (1 + weight)
        if offset and name.endswith("norm.weight"):
            array = array - offset
        return array

    def tensor_type(self, name: str) -> str:
        """The GGUF type name (``"Q4_1"``, ``"F32"``, ...) of HF tensor ``name``."""
        if name not in self.tensors:
            raise ValueError(f"GGUF file {self.path!r} has no tensor for {name!r}")
        return self.tensors[name][0].tensor_type.name

    def get_quantized(self, name: str) -> QuantizedWeight | None:
        """2-D tensor ``name`` as a ``QuantizedWeight`` ``[in, out]`` (see the module docstring),
        or None for a float tensor. Read from the file's ``GGUFWeightsCache`` when it holds the
        tensor (memory-mapped, no unpacking), else converted and recorded for ``save_cache``."""
        qtype = self.tensor_type(name)
        if qtype in FLOAT_TYPES or self.tensors[name][1] is not None:  # float, or one expert
            return None
        if self.weights_cache is None:
            self.weights_cache = GGUFWeightsCache(self.path)
        weight = self.weights_cache.get(name)
        if weight is None:
            weight = self._convert_quantized(name, qtype)
            self.weights_cache.record(name, weight)
        return weight

    def save_cache(self) -> None:
        """Writes the converted quantised tensors to the weights cache (when any were)."""
        if self.weights_cache is not None:
            self.weights_cache.save()

    def _convert_quantized(self, name: str, qtype: str) -> QuantizedWeight:
        """The file's codes, scales and minimums of ``name`` (``gguf_blocks``), rows back in HF
        order, as a ``[in, out]`` weight."""
        tensor = self.tensors[name][0]
        rows, depth = (int(d) for d in reversed(tensor.shape))  # [out, in]
        decoded = decode_blocks(qtype, tensor.data, rows, depth)
        return kept_weight(decoded, lambda rows: self._unpermute(name, rows))

    def _unpermute(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Rows (first axis) of tensor ``name`` back in HF's order where the family's converter
        reorders them (``gguf_rows``: llama's rotary Q/K permutation, Falcon's fused QKV)."""
        reorder = self.family.gguf_rows
        return rows if reorder is None else reorder(self, name, rows)

    def _stacked(self, tensor) -> np.ndarray:
        """A stacked expert tensor ``[E, out, in]``, dequantised once for its E reads."""
        if self._stacked_cache is None or self._stacked_cache[0] != tensor.name:
            whole = f"{tensor.name} (stacked)"
            self.tensors[whole] = (tensor, None)
            self._stacked_cache = (tensor.name, self.get_tensor(whole))
        return self._stacked_cache[1]

    def getter(self) -> Callable[[str], np.ndarray]:
        return self.get_tensor

    def kept_weight_bytes(self, float_bytes: int) -> int:
        """Bytes the file's tensors take loaded with ``quantization="auto"`` (``jaxgen plan``):
        each quantised matrix (a stacked expert tensor excepted) as its kept
        ``QuantizedWeight`` (:func:`kept_bytes`), every other tensor at ``float_bytes`` an
        element (the load's dtype). From the tensor table alone: no tensor is read."""
        experts = {tensor.name for tensor, expert in self.tensors.values() if expert is not None}
        total = 0
        for tensor in self.reader.tensors:
            qtype = tensor.tensor_type.name
            if qtype in KEPT_TYPES and len(tensor.shape) == 2 and tensor.name not in experts:
                depth, rows = (int(d) for d in tensor.shape)  # ggml order: innermost first
                total += kept_bytes(qtype, rows, depth)
            else:
                total += int(tensor.n_elements) * float_bytes
        return total


def kept_bytes(qtype: str, rows: int, depth: int) -> int:
    """Bytes of a ``[rows, depth]`` tensor of kept type ``qtype`` as ``get_quantized`` holds it
    (each leaf grows with the number of blocks, so: blocks x one block's)."""
    return rows * depth // BLOCK_LAYOUTS[qtype][0] * _block_bytes(qtype)


@functools.cache
def _block_bytes(qtype: str) -> int:
    """The kept bytes of one block of ``qtype`` (a zero block, converted as the loader does)."""
    elements, nbytes = BLOCK_LAYOUTS[qtype]
    return kept_weight(decode_blocks(qtype, np.zeros((1, nbytes), np.uint8), 1, elements)).nbytes


def kept_weight(decoded: DecodedBlocks, reorder=lambda rows: rows) -> QuantizedWeight:
    """``decoded`` (a ``[out, in]`` tensor's blocks) as a ``[in, out]`` ``QuantizedWeight``, its
    rows (codes, scales, minimums and their two-level codes alike) first put in order by
    ``reorder``."""

    def column_major(rows):
        return None if rows is None else np.ascontiguousarray(reorder(rows).T)

    def codes(rows):  # two-level codes: 4-bit ones two a byte (group 2i in the low nibble)
        rows = column_major(rows)
        if rows is None or decoded.scale_code_bits == 8:
            return rows
        return pack_int4(rows.astype(np.uint8))

    values = column_major(decoded.codes)
    if decoded.kind == "int4":
        stored = pack_int4(values)
    elif decoded.kind in PLANE_KINDS:
        stored = pack_planes(values, decoded.kind)
    else:
        stored = values
    return QuantizedWeight(
        stored,
        column_major(decoded.scales),
        column_major(decoded.mins),
        kind=decoded.kind,
        group_size=decoded.group_size,
        shape=values.shape,
        scale_codes=codes(decoded.scale_codes),
        min_codes=codes(decoded.min_codes),
        codebook=decoded.codebook,
    )


def _check_tensor_types(tensors, path: str) -> None:
    """``ValueError`` naming the first tensor whose type jaxgen cannot load (before any is)."""
    for tensor in tensors:
        qtype = tensor.tensor_type.name
        if qtype not in SUPPORTED_QUANT_TYPES:
            raise ValueError(
                f"GGUF file {path!r}: tensor {tensor.name!r} has quantization type {qtype}, "
                f"which jaxgen does not load; supported: {', '.join(SUPPORTED_QUANT_TYPES)}"
            )
