"""Quantising float kernels at load, and which parameters a ``quantization`` choice quantises.

The rules are by parameter path, as in qwix (Google's JAX quantisation library): every
``Linear`` kernel takes the chosen kind; the LM head (an untied ``lm_head`` kernel, or a tied
embedding, held as its head kernel) keeps 8 bits under int4, since its errors reach every logit.
int8 and int4 use groups of 32 along the input (GGUF's Q8_0 and Q4_1 layouts): per-channel int8
agreed with the float model on 95.8% of teacher-forced tokens (default model, 32 x 64), under
the 98% the groups reach, for 6% more bytes.
Norms, biases and rotary tables stay float. Quantising runs in numpy on the host, one tensor at a
time, so a float copy of the whole model never sits on the device.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jaxgen.quantization.bit_planes import PLANE_KINDS
from jaxgen.quantization.quantized_weight import QuantizedWeight, pack_int4, validate_layout

# What users pass: ``auto`` keeps a GGUF's quantised types and a float checkpoint float; ``none``
# dequantises everything; the others quantise a float checkpoint at load ("w8a8": int8 as "int8",
# and every matmul quantises its input to int8 too, per row and 32 columns; "int8" lets integer
# kernels take the input as 16-bit codes: QuantizedWeight). "w4a8" is llama.cpp's CPU numbers:
# a GGUF keeps its tensors (as "auto") and a float checkpoint is quantised to int4 (embedding
# and LM head int8), and their matmuls quantise the input to int8 as "w8a8" does.
QUANTIZATION_CHOICES = ("auto", "none", "int8", "int4", "fp8", "w8a8", "w4a8")
FP8_MAX = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)  # 448


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantizationSpec:
    """One weight's quantisation: ``kind`` with ``group_size`` (None: per output channel) and,
    for int4, a per-group minimum (``asymmetric``); ``activations``: "int8" quantises the input
    too (int8 / int4), "int16" lets integer kernels take it as 16-bit codes (int8;
    ``QuantizedWeight``)."""

    kind: str
    group_size: int | None = None
    asymmetric: bool = False
    activations: str = "float"


def validate_quantization(value) -> str:
    """``value`` if it is a known ``quantization`` choice, else a ``ValueError`` naming it."""
    if value not in QUANTIZATION_CHOICES:
        raise ValueError(
            f"quantization must be one of {', '.join(map(repr, QUANTIZATION_CHOICES))}, "
            f"got {value!r}"
        )
    return value


def spec_for_path(quantization: str, path: tuple) -> QuantizationSpec | None:
    """The spec a parameter at ``path`` gets under ``quantization`` (None: stays float)."""
    if quantization in ("auto", "none"):
        return None
    head = path[-1] == "embedding" or path[0] == "lm_head"
    if quantization == "w8a8" or (quantization == "w4a8" and head):
        return QuantizationSpec(kind="int8", group_size=32, activations="int8")
    if quantization == "w4a8":
        return QuantizationSpec(kind="int4", group_size=32, asymmetric=True, activations="int8")
    if quantization == "int8" or (quantization == "int4" and head):
        return QuantizationSpec(kind="int8", group_size=32, activations="int16")
    if quantization == "int4":
        return QuantizationSpec(kind="int4", group_size=32, asymmetric=True)
    return QuantizationSpec(kind="fp8")


def with_int8_activations(weight: QuantizedWeight) -> QuantizedWeight:
    """``weight`` taking int8 activations ("w4a8" on a kept GGUF tensor) where the native
    W8A8 / W4A8 kernels take its layout: int8 without minimums or int4, K and group size
    multiples of 32, float16 scales (GGUF's Q8_0, Q4_0, Q4_1, Q5_0 widened to int8, IQ4_NL).
    Others (the K-quants' groups of 16 or two-level scales, Q5_1's minimums, IQ4_XS) stay as
    they are: float activations, the file's numbers."""
    if weight.codebook is not None or weight.kind in PLANE_KINDS:  # codes that are numbers
        plain = with_int8_activations(weight.plain_layout())
        return plain if plain.activations == "int8" else weight
    if weight.two_level:
        return weight
    try:
        validate_layout(weight.kind, weight.group_size, weight.shape, "int8")
    except ValueError:
        return weight
    if weight.scales.dtype != jnp.float16 or (weight.kind == "int8" and weight.mins is not None):
        return weight
    return dataclasses.replace(weight, activations="int8")


def quantize_kernel(w, spec: QuantizationSpec) -> QuantizedWeight:
    """``w`` ([K, N] float kernel) quantised per ``spec``, scales grouped along K.

    int8 and int4 scales are float16 (as GGUF's), and the codes are computed against the rounded
    scale, so native kernels reading float16 scales compute the same weight."""
    w = np.asarray(w, np.float32)
    if w.ndim != 2:
        raise ValueError(f"only [K, N] kernels are quantised, got shape {w.shape}")
    depth, columns = w.shape
    group = depth if spec.group_size is None else spec.group_size
    validate_layout(spec.kind, group, (depth, columns), spec.activations)
    blocks = w.reshape(depth // group, group, columns)
    if spec.kind == "fp8":
        scales = np.abs(blocks).max(axis=1) / FP8_MAX  # [G, N]
        scales = np.where(scales == 0, 1.0, scales).astype(np.float32)
        values = (blocks / scales[:, None]).astype(ml_dtypes.float8_e4m3fn)
        return QuantizedWeight(
            jnp.asarray(values.reshape(depth, columns)), jnp.asarray(scales), None,
            kind="fp8", group_size=group, shape=(depth, columns),
        )  # fmt: skip
    if spec.kind == "int8":
        scales = _half(np.abs(blocks).max(axis=1) / 127.0)
        codes = np.clip(np.rint(blocks / _safe(scales)[:, None]), -127, 127).astype(np.int8)
        return QuantizedWeight(
            jnp.asarray(codes.reshape(depth, columns)), jnp.asarray(scales), None,
            kind="int8", group_size=group, shape=(depth, columns), activations=spec.activations,
        )  # fmt: skip
    if spec.asymmetric:
        low, high = blocks.min(axis=1), blocks.max(axis=1)
        scales, mins = _half((high - low) / 15.0), low.astype(np.float16)
        shifted = blocks - mins.astype(np.float32)[:, None]
        unsigned = np.clip(np.rint(shifted / _safe(scales)[:, None]), 0, 15)
    else:
        scales, mins = _half(np.abs(blocks).max(axis=1) / 7.0), None
        unsigned = np.clip(np.rint(blocks / _safe(scales)[:, None]), -8, 7) + 8
    values = pack_int4(unsigned.reshape(depth, columns))
    return QuantizedWeight(
        jnp.asarray(values), jnp.asarray(scales), None if mins is None else jnp.asarray(mins),
        kind="int4", group_size=group, shape=(depth, columns), activations=spec.activations,
    )  # fmt: skip


def _half(scales: np.ndarray) -> np.ndarray:
    return scales.astype(np.float16)


def _safe(scales: np.ndarray) -> np.ndarray:
    """float32 scales with zeros (all-zero groups) as 1, so their codes are 0."""
    scales = scales.astype(np.float32)
    return np.where(scales == 0, 1.0, scales)
