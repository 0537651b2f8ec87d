"""Quantised-weight matmul for XLA:CPU as a native kernel (C++ through the XLA FFI).

``PackedQuantizedWeight`` is a ``QuantizedWeight`` (int8 with or without minimums, or int4 with
or without them; float16 scales, float32 ones, or two-level ones: a GGUF K-quant's float16
super-block scale and int8 sub-block codes, whose products the kernel forms in float32 per
panel; int4 codes may index a 16-entry codebook, IQ4_NL / IQ4_XS's grid, looked up in
registers) repacked into 16-column panels (``native/quantized_panels.h``) that the kernel
dequantises in registers: per step it reads the 8- or 4-bit codes, never a float copy of the
weight. The panels have no 2-, 3-, 5- or 6-bit tiles: a bit-plane weight (GGUF's Q2_K, Q3_K,
Q5_0, Q5_1, Q5_K, Q6_K) is widened to int4 / int8 codes as it is packed (``packed_form``;
``bit_planes.widen``, the same numbers), so on this backend it takes those bytes (Q6_K 8.56
bits a weight against the file's 6.56). int4 panels hold each 8 rows of a column in one 32-bit lane (group sizes a multiple of
8; others keep XLA's path). Like ``PackedWeight`` it carries its own ``matmul`` / ``matmul_group``, so models run it
through ``jaxgen.layers.linear`` without importing this module. It takes a ``NormedInput``
(``norms_input``): the kernel norms the rows before the products, saving XLA's four small norm
thunks per call. An int8 weight with int8 activations (``quantization="w8a8"``) quantises x's
live rows in the kernel and sums the products in integers (``native/matmul_w8a8.h``, AVX-512
VNNI); on a CPU without VNNI x is quantised in XLA and the weight-only path runs on it (the same
numbers up to rounding). An int8 weight quantised at load (``activations="int16"``) takes x as
16-bit codes on a VNNI CPU the same way (two bytes, two ``vpdpbusd``), and x as it is elsewhere.
Reference: ``QuantizedWeight.matmul``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxgen.backends.cpu_kernels.build import load_library, register_simd_kernel
from jaxgen.backends.cpu_kernels.matmul import kernel_rows
from jaxgen.layers.linear import NormedInput
from jaxgen.quantization import QuantizedWeight
from jaxgen.quantization.bit_planes import WIDENED_KINDS, widen
from jaxgen.quantization.quantized_weight import fake_quantize_activations

TARGET = "jaxgen_matmul_quantized"
QUANT_PANEL = 16  # kQuantPanel in native/quantized_panels.h
ACTIVATION_BITS = {"float": 32, "int16": 16, "int8": 8}  # x as the kernel takes it
INT4_BLOCK_ROWS = 8  # kInt4BlockRows: int4 rows in one 32-bit lane
# Whether a codebook weight (IQ4_NL / IQ4_XS) is packed as its 4-bit indices, looked up by the
# kernel, or (False, the default) as its int8 values (``QuantizedWeight.plain_layout``): the
# lookup tiles hold it at the file's bytes but ran 1.4x (one row) to 3x (4 rows) the int8
# tiles' time on the 2-core VM (docs/measurements/2026-12-04-*-gguf-memory.md).
LOOK_UP_CODEBOOKS = False


@functools.cache
def quantized_matmul_available() -> bool:
    """Builds and registers the kernel once; False without a build or AVX2 + FMA + F16C."""
    return register_simd_kernel("JaxgenQuantizedMatmulHasSimd", "JaxgenMatmulQuantized", TARGET)


@functools.cache
def w8a8_kernel_available() -> bool:
    """Whether the build has the int8-activation path (AVX-512 VNNI + VBMI on this CPU)."""
    if not quantized_matmul_available():
        return False
    check = load_library().JaxgenW8A8HasVnni
    check.restype = ctypes.c_bool
    return bool(check())


SCALE_BITS = {jnp.dtype(jnp.float16): 16, jnp.dtype(jnp.float32): 32}


def can_pack_quantized(weight) -> bool:
    """Whether the native kernel takes ``weight``: int8 (with or without minimums), or int4 in
    groups of a multiple of 8 rows (bit planes: the kind they widen to), with float16, float32 or two-level scales (mins of the same
    dtype);
    integer activations only with float16 scales and, for int8, no minimums (the W8A8 / W4A8
    tiles' layouts)."""
    if not isinstance(weight, QuantizedWeight):
        return False
    kind = WIDENED_KINDS.get(weight.kind, weight.kind)  # bit planes: packed widened
    if kind not in ("int8", "int4"):
        return False
    scale_dtype = jnp.dtype(weight.scales.dtype)
    if scale_dtype not in SCALE_BITS or (
        weight.mins is not None and jnp.dtype(weight.mins.dtype) != scale_dtype
    ):
        return False
    if kind == "int4" and weight.group_size % INT4_BLOCK_ROWS:
        return False
    if weight.activations != "float" and (
        SCALE_BITS[scale_dtype] != 16 or (kind == "int8" and weight.mins is not None)
    ):
        return False
    return True


def _panels(array, columns: int, xp=jnp):  # [R, N] -> [ceil(N / 16), R, 16]
    """``array``'s columns in panels of 16 (``xp``: ``jnp``, or ``np`` to pack on the host)."""
    panels = -(-columns // QUANT_PANEL)
    array = xp.pad(xp.asarray(array), ((0, 0), (0, panels * QUANT_PANEL - columns)))
    return array.reshape(array.shape[0], panels, QUANT_PANEL).transpose(1, 0, 2)


def _int4_lanes(panels: jax.Array) -> jax.Array:  # [P, K / 2, 16] -> [P, K / 2, 16] uint8
    """Byte rows of int4 panels regrouped so that each 8 rows of a column are one little-endian
    uint32 lane (row ``8b + j`` in bits ``4j``..``4j + 3``): bytes ``4b``..``4b + 3`` of a
    column, which hold rows ``8b``..``8b + 7`` two by two, become that column's lane in block
    ``b``."""
    count, byte_rows, width = panels.shape
    blocks = byte_rows // (INT4_BLOCK_ROWS // 2)
    lanes = panels.reshape(count, blocks, INT4_BLOCK_ROWS // 2, width).transpose(0, 1, 3, 2)
    return lanes.reshape(count, byte_rows, width)


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["values", "scales", "mins", "scale_codes", "min_codes"],
    meta_fields=[
        "bits",
        "columns",
        "depth",
        "groups",
        "offsets",
        "activations",
        "groups_per_super",
        "codebook",
    ],
)
@dataclasses.dataclass(frozen=True)
class PackedQuantizedWeight:
    """A ``QuantizedWeight`` in the native kernel's panels (a pytree; the rest static).

    Its arrays are its own (``offsets`` zero), or flat buffers shared with other weights
    (:func:`pack_shared`) in which its panels start at element ``offsets``."""

    values: jax.Array  # [P, K, 16] int8 or [P, K / 2, 16] uint8 (8-row lanes: _int4_lanes)
    scales: jax.Array  # [P, K / group, 16] float16 or float32
    mins: jax.Array | None  # [P, K / group, 16] like scales (int4; int8 with mins), else None
    bits: int  # 8 or 4
    columns: int  # N
    depth: int  # K
    groups: int  # K / group: scale rows per panel
    offsets: tuple[int, ...] = (0,) * 5  # of the values, scales, mins, scale / min codes
    activations: str = "float"  # "int8" / "int16": x's codes (QuantizedWeight.activations)
    # Two-level: scales / mins [P, K / group / S, 16] float16 super-block numbers, these
    # [P, K / group, 16] int8 (S = groups_per_super); else None.
    scale_codes: jax.Array | None = None
    min_codes: jax.Array | None = None
    groups_per_super: int = 1
    codebook: tuple[int, ...] | None = None  # int4: the numbers its codes index (no mins)

    norms_input = True  # takes a NormedInput as x (jaxgen.layers.linear)

    @classmethod
    def pack(cls, weight: QuantizedWeight, xp=jnp) -> PackedQuantizedWeight:
        """``weight`` in panels; ``xp=np`` packs on the host (numpy arrays in the fields)."""
        weight = packed_form(weight)
        if not can_pack_quantized(weight):
            raise ValueError(
                f"the native kernel takes int8 / int4 (groups a multiple of 8) weights with "
                f"float16 or float32 scales (integer activations: float16, int8 without mins), "
                f"got {weight.kind} with {weight.scales.dtype} scales in groups of "
                f"{weight.group_size}, activations {weight.activations!r}"
            )
        columns = weight.shape[1]
        scales = xp.asarray(weight.scales)
        mins, values = None, _panels(weight.values, columns, xp)
        if weight.two_level:  # the kernel forms a symmetric int4 weight's mins (-8 * scale)
            # (a codebook's weight has none)
            panels = [
                None if leaf is None else _panels(leaf, columns, xp)
                for leaf in (weight.scales, weight.mins, weight.scale_codes, weight.min_codes)
            ]
            return cls(
                _int4_lanes(values) if weight.kind == "int4" else values,
                panels[0],
                panels[1],
                **packed_fields(weight),
                scale_codes=panels[2],
                min_codes=panels[3],
            )
        if weight.kind == "int4":
            values = _int4_lanes(values)
            if weight.mins is not None:
                mins = xp.asarray(weight.mins)
            elif weight.codebook is None:
                mins = scales * -8  # exact
        elif weight.mins is not None:
            mins = xp.asarray(weight.mins)
        if mins is not None:
            mins = _panels(mins, columns, xp)
        return cls(values, _panels(scales, columns, xp), mins, **packed_fields(weight))

    @property
    def shape(self) -> tuple[int, int]:
        return (self.depth, self.columns)

    @property
    def layout(self) -> tuple:
        """What one native call needs its weights to share: bits, activations, scale bits,
        whether they carry minimums, groups per super-block scale (0: one-level) and the
        codebook (or None)."""
        scale_bits = SCALE_BITS[jnp.dtype(self.scales.dtype)]
        super_groups = self.groups_per_super if self.scale_codes is not None else 0
        minimums = self.mins is not None
        return (self.bits, self.activations, scale_bits, minimums, super_groups, self.codebook)

    @property
    def panels(self) -> int:
        return -(-self.columns // QUANT_PANEL)

    @property
    def dtype(self):
        return jnp.dtype(jnp.float32)

    def matmul(self, x: jax.Array | NormedInput, live_rows: jax.Array | None = None) -> jax.Array:
        """``x @ w`` (see :func:`matmul_quantized_cpu_group`)."""
        return matmul_quantized_cpu_group(x, [self], live_rows=live_rows)[0]

    @staticmethod
    def matmul_group(
        x: jax.Array | NormedInput,
        weights: list[PackedQuantizedWeight],
        live_rows: jax.Array | None = None,
    ) -> list[jax.Array]:
        """``[x @ w for w in weights]``: one native call when all have the same ``layout``."""
        if len({w.layout for w in weights}) > 1:
            return [w.matmul(x, live_rows) for w in weights]
        return matmul_quantized_cpu_group(x, weights, live_rows=live_rows)


def matmul_quantized_cpu_group(
    x: jax.Array | NormedInput,  # [..., K] float32
    weights: list[PackedQuantizedWeight],  # same layout, each [K, N_i]
    *,
    live_rows: jax.Array | None = None,  # [2, 2] int32 [begin, end) spans of x's flat rows
) -> list[jax.Array]:  # each [..., N_i] float32
    """``[x @ dequant(w_i)]`` in one native call; rows outside ``live_rows`` come out as 0. A
    ``NormedInput`` with a float32 weight of x's width is normed by the kernel (any other is
    computed in XLA first). Weights with int8 activations quantise x first: in the kernel
    where it has VNNI, else in XLA; int16 ones in the kernel where it has VNNI, else not at
    all."""
    if not weights or len({w.layout for w in weights}) != 1:
        raise ValueError(
            "weights must be one or more PackedQuantizedWeights of the same bits and activations "
            "(and scale dtype, and minimums or none)"
        )
    activation_bits = ACTIVATION_BITS[weights[0].activations]
    if activation_bits < 32 and not w8a8_kernel_available():
        if activation_bits == 8:  # int8 codes are the weight's numbers: quantise in XLA
            x = fake_quantize_activations(x.value() if isinstance(x, NormedInput) else x)
        activation_bits = 32
    norm_weight, eps = jnp.zeros((0,), jnp.float32), 0.0
    if isinstance(x, NormedInput):
        if x.weight.shape == x.shape[-1:] and x.weight.dtype == x.dtype == jnp.float32:
            x, norm_weight, eps = x.x, x.weight, x.eps
        else:
            x = x.value()
    if x.dtype != jnp.float32:
        raise ValueError(f"x must be float32 for the CPU kernel, got {x.dtype}")
    depth = x.shape[-1]
    for w in weights:
        if w.shape[0] != depth:
            raise ValueError(
                f"x's last dimension {depth} must equal the weight's depth {w.shape[0]}"
            )
    if not quantized_matmul_available():
        raise RuntimeError("the quantised CPU matmul kernel could not be built on this machine")
    rows, live_rows = kernel_rows(x, depth, live_rows)
    args = []
    for w in weights:
        leaves = (w.values, w.scales, w.mins, w.scale_codes, w.min_codes)
        args += [leaf for leaf in leaves if leaf is not None]
    shapes = [
        jax.ShapeDtypeStruct((rows.shape[0], w.panels * QUANT_PANEL), jnp.float32) for w in weights
    ]
    outs = jax.ffi.ffi_call(TARGET, shapes)(
        rows,
        jnp.asarray(live_rows, jnp.int32),
        norm_weight,  # [K], or [0]: no norm
        *args,
        eps=np.float32(eps),
        bits=np.int64(weights[0].bits),
        activation_bits=np.int64(activation_bits),
        scale_bits=np.int64(weights[0].layout[2]),
        has_mins=np.int64(weights[0].layout[3]),
        super_groups=np.int64(weights[0].layout[4]),
        codebook=np.array(weights[0].codebook or (), np.int64),
        panels=np.array([w.panels for w in weights], np.int64),
        groups=np.array([w.groups for w in weights], np.int64),
        offsets=np.array([w.offsets for w in weights], np.int64).reshape(-1),
    )
    return [
        out[:, : w.columns].reshape(*x.shape[:-1], w.columns)
        for out, w in zip(outs, weights, strict=True)
    ]


def packed_form(weight: QuantizedWeight) -> QuantizedWeight:
    """``weight`` as the kernel takes it: bit planes widened to int8 / int4 and 4-bit two-level
    codes to int8 (``widen``), a codebook's indices as their int8 values unless
    ``LOOK_UP_CODEBOOKS`` (arrays, or ``ShapeDtypeStruct``s)."""
    weight = widen(weight)
    if weight.codebook is None or LOOK_UP_CODEBOOKS:
        return weight
    return weight.plain_layout()


def packed_fields(weight: QuantizedWeight) -> dict:
    """``PackedQuantizedWeight``'s static fields for ``weight``."""
    return dict(
        bits=8 if weight.kind == "int8" else 4,
        columns=weight.shape[1],
        depth=weight.shape[0],
        groups=weight.shape[0] // weight.group_size,
        activations=weight.activations,
        groups_per_super=weight.groups_per_super,
        codebook=weight.codebook,
    )
