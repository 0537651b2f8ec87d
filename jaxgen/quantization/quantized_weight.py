"""``QuantizedWeight``: one quantised-weight representation for every backend.

A ``[K, N]`` kernel (``Linear``'s orientation: input features first) stored as integer or fp8
``values`` plus per-group ``scales`` along K (and, for asymmetric int4, per-group ``mins``):

| kind | values | dequantised element ``[k, n]`` (``g = k // group_size``) |
| --- | --- | --- |
| ``int8`` | int8 ``[K, N]`` | ``scales[g, n] * values[k, n]`` |
| ``int4`` | uint8 ``[K / 2, N]``, two 4-bit ``u`` per byte | ``scales[g, n] * (u - 8)``, or with ``mins``: ``scales[g, n] * u + mins[g, n]``, or with a ``codebook``: ``scales[g, n] * codebook[u]`` |
| ``fp8`` | float8_e4m3fn ``[K, N]`` | ``scales[g, n] * values[k, n]`` |
| ``int2`` / ``int3`` / ``int5`` / ``int6`` | uint8 ``[K * b / 8, N]``, bit planes of ``b``-bit ``u`` (``bit_planes``) | ``scales[g, n] * (u - 2 ** (b - 1))``, or with ``mins``: ``scales[g, n] * u + mins[g, n]`` |

An int8 or int4 weight may also quantise its input (``activations="int8"``: W8A8,
``quantization="w8a8"``; W4A8, ``quantization="w4a8"``): x is taken per row and 32 columns as
``s * q`` with ``s = max|x| / 127`` and ``q = round_half_even(x * 127 / max|x|)``
(:func:`quantize_activations`), so a kernel can sum ``q * value`` in integers. :meth:`matmul`
computes ``fake_quantize_activations(x) @ dequantize()``, the reference the native W8A8 and
W4A8 kernels are held to. ``activations="int16"`` (an int8 weight quantised at load,
``quantization="int8"``) lets a kernel that sums in integers take x as 16-bit codes the same way
(``L = 32767`` in place of 127: within ``max|x| / 65534`` of x per group, finer than float16);
every other path, the reference included, uses x as it is. A GGUF's weights keep ``"float"``
(a kept file computes its dequantised model's numbers) unless loaded with ``"w4a8"``.

Two-level scales (GGUF's K-quants and IQ4_XS): with ``scale_codes`` (int8 ``[K / group_size,
N]``), ``scales`` is one float16 super-block scale per ``groups_per_super`` groups (``[K /
group_size / groups_per_super, N]``) and the group's scale is ``float32(scales[g //
groups_per_super, n]) * scale_codes[g, n]`` (4-bit codes, GGUF's Q2_K: uint8 ``[K / group_size
/ 2, N]``, two a byte, group ``2i`` in the low nibble); ``min_codes`` likewise turns ``mins`` into
super-block minimums (``mins[g // groups_per_super, n] * min_codes[g, n]``). The products are
formed in float32, where they are exact (an 11-bit float16 significand times a code of at most
8 bits), so the weight is the one the float32 group scales stood for, in about 9 bits per group
instead of 32 (:meth:`group_scales`, :meth:`plain_layout`). A ``codebook`` (16 integers in
-128..127, static: GGUF's IQ4_NL / IQ4_XS non-linear grid) makes an int4 weight's codes indices
into it, so those types keep their 4-bit codes. The bit-plane kinds keep GGUF's 2-, 3-, 5- and
6-bit codes at their width (Q2_K, Q3_K, Q5_0, Q5_1, Q5_K, Q6_K), unpacked with shifts and masks
in the jitted dequantisation; :meth:`plain_layout` widens them to int8 / int4
(``bit_planes.widen``) for consumers that read codes as numbers.

Byte ``i`` of an int4 column holds row ``2i`` in its low nibble and row ``2i + 1`` in its high
one. ``group_size == K`` is per-output-channel scaling. GGUF's Q8_0, Q4_0 and Q4_1 blocks map
onto int8 / int4 / int4-with-mins with group 32 value for value (``jaxgen.loaders.gguf_loader``).

It is a pytree (``values``, ``scales``, ``mins``, ``scale_codes``, ``min_codes`` are leaves;
``kind``, ``group_size``, ``shape``, ``activations`` and ``codebook`` static), so the jitted step takes it as an argument like any parameter, and it has
the kernel protocol of ``jaxgen.layers.linear``: :meth:`matmul` computes ``x @ dequantize()``
in XLA (the reference path; XLA fuses the dequantisation into the dot's operand on TPU/GPU).
Backends with native kernels replace it in ``prepare_params`` (the "cpu" backend's
``PackedQuantizedWeight``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxgen.quantization.bit_planes import (
    BLOCK_ROWS,
    CODE_BITS,
    PLANE_KINDS,
    unpack_planes,
    unpack_scale_codes,
    widen,
)

KINDS = ("int8", "int4", "fp8", *PLANE_KINDS)  # appended only: the weights cache stores indices
ACTIVATIONS = ("float", "int16", "int8")  # what an int8 weight does with its input
ACTIVATION_GROUP = 32  # columns of x per activation scale (int8 / int16 activations)
# The weight kinds each integer activation type applies to (W8A8 / W4A8; W8A16).
INTEGER_ACTIVATION_KINDS = {"int8": ("int8", "int4"), "int16": ("int8",)}
VALUE_DTYPES = {"int8": jnp.int8, "int4": jnp.uint8, "fp8": jnp.float8_e4m3fn}
VALUE_DTYPES.update({kind: jnp.uint8 for kind in PLANE_KINDS})


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["values", "scales", "mins", "scale_codes", "min_codes"],
    meta_fields=["kind", "group_size", "shape", "activations", "codebook"],
)
@dataclasses.dataclass(frozen=True)
class QuantizedWeight:
    """A quantised ``[K, N]`` kernel (see the module docstring)."""

    values: jax.Array  # [K, N] int8 / fp8, [K / 2, N] uint8 (int4), [K * b / 8, N] planes
    scales: jax.Array  # [K / group_size, N] float16 / float32 (two-level: super-block, float16)
    mins: jax.Array | None  # like scales (asymmetric int4; int8 with minimums), or None
    kind: str
    group_size: int
    shape: tuple[int, int]  # (K, N)
    activations: str = "float"  # "int8" / "int16": x's codes per row and 32 columns (docstring)
    scale_codes: jax.Array | None = None  # [G, N] int8 ([G / 2, N] uint8: 4-bit), or None
    min_codes: jax.Array | None = None  # like scale_codes: two-level mins, or None
    codebook: tuple[int, ...] | None = None  # int4: the 16 numbers its codes index, or None

    def __post_init__(self):
        validate_layout(self.kind, self.group_size, self.shape, self.activations)
        validate_two_level(self)
        validate_codebook(self)

    @property
    def two_level(self) -> bool:
        """Whether ``scales`` (and ``mins``) are super-block scales times ``scale_codes``."""
        return self.scale_codes is not None

    @property
    def groups_per_super(self) -> int:
        """Groups per super-block scale (1 for one-level scales)."""
        groups = self.shape[0] // self.group_size
        return groups // self.scales.shape[0] if self.two_level else 1

    @property
    def dtype(self):
        """The dtype the weight dequantises to by default (its group scales')."""
        return jnp.dtype(jnp.float32) if self.two_level else jnp.dtype(self.scales.dtype)

    def group_scales(self) -> jax.Array:  # [K / group_size, N]
        """Each group's scale: ``scales``, or (two-level) the float32 products (docstring)."""
        if not self.two_level:
            return self.scales
        return _super_times_codes(self.scales, self.scale_codes, self.groups_per_super)

    def group_mins(self) -> jax.Array | None:  # [K / group_size, N], or None
        """Each group's minimum: ``mins``, or (two-level) the float32 products (docstring)."""
        if self.min_codes is None:
            return self.mins
        return _super_times_codes(self.mins, self.min_codes, self.groups_per_super)

    def plain_layout(self) -> QuantizedWeight:
        """The same weight with a (float32) scale and minimum stored per group and codes that
        are numbers (a codebook's int4 indices as its int8 values, bit planes widened to int8 /
        int4): for consumers of that layout only (arrays, or ``jax.ShapeDtypeStruct``s ahead
        of time)."""
        weight = widen(self)  # bit planes and 4-bit two-level codes as int8 / int4 codes
        if self.two_level:
            if isinstance(self.scale_codes, jax.ShapeDtypeStruct):
                scales = _struct_like(weight.scale_codes, jnp.float32)
                mins = None if self.mins is None else _struct_like(weight.min_codes, jnp.float32)
            else:
                scales, mins = weight.group_scales(), weight.group_mins()
            weight = dataclasses.replace(
                weight, scales=scales, mins=mins, scale_codes=None, min_codes=None
            )
        if self.codebook is None:
            return weight
        if isinstance(self.values, jax.ShapeDtypeStruct):
            values = _struct_like(self.values, jnp.int8, self.shape)
        else:
            indices = _unpack_int4_jnp(self.values, *self.shape).astype(jnp.int32)
            values = jnp.asarray(self.codebook, jnp.int8)[indices]
        return dataclasses.replace(weight, values=values, kind="int8", codebook=None)

    @property
    def nbytes(self) -> int:
        return sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(self))

    def dequantize(self, dtype=jnp.float32) -> jax.Array:  # [K, N]
        """The float weight the values and scales stand for."""
        depth, columns = self.shape
        groups = depth // self.group_size
        if self.kind == "int4" and self.codebook is not None:
            indices = _unpack_int4_jnp(self.values, depth, columns).astype(jnp.int32)
            codes = jnp.asarray(self.codebook, jnp.float32)[indices]
        elif self.kind == "int4" or self.kind in PLANE_KINDS:
            if self.kind == "int4":
                unsigned = _unpack_int4_jnp(self.values, depth, columns)
            else:
                unsigned = unpack_planes(self.values, self.kind, depth, columns)
            unsigned = unsigned.astype(jnp.float32)
            half = float(1 << (CODE_BITS[self.kind] - 1))  # symmetric: u - 8 for int4
            codes = unsigned if self.mins is not None else unsigned - half
        else:
            codes = self.values.astype(jnp.float32)
        codes = codes.reshape(groups, self.group_size, columns)
        weight = codes * self.group_scales().astype(jnp.float32)[:, None, :]
        if self.mins is not None:
            weight = weight + self.group_mins().astype(jnp.float32)[:, None, :]
        return weight.reshape(depth, columns).astype(dtype)

    def matmul(self, x: jax.Array, live_rows: jax.Array | None = None) -> jax.Array:
        """``x @ dequantize()`` (every row computed; ``live_rows`` is for native kernels)."""
        del live_rows
        if self.activations == "int8":
            x = fake_quantize_activations(x)
        return jnp.dot(x, self.dequantize(x.dtype))

    def take_columns(self, ids: jax.Array, dtype=jnp.float32) -> jax.Array:  # [T] -> [T, K]
        """Columns ``ids`` dequantised, as rows: the embedding lookup of a quantised tied
        embedding, which is held as its LM-head kernel ``[hidden, vocab]``."""
        picked = jax.tree_util.tree_map(lambda leaf: jnp.take(leaf, ids, axis=1), self)
        picked = dataclasses.replace(picked, shape=(self.shape[0], int(ids.shape[0])))
        return picked.dequantize(dtype).T


def validate_layout(
    kind: str, group_size: int, shape: tuple[int, int], activations: str = "float"
) -> None:
    """``ValueError`` for an unknown kind or a group size that does not divide K; int8
    activations need an int8 or int4 weight (int16 ones an int8 weight) whose K and group size
    are multiples of 32."""
    if kind not in KINDS:
        raise ValueError(f"quantization kind must be one of {KINDS}, got {kind!r}")
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be one of {ACTIVATIONS}, got {activations!r}")
    depth = shape[0]
    if not isinstance(group_size, int) or group_size < 1 or depth % group_size:
        raise ValueError(
            f"group_size {group_size!r} must divide the input width {depth} (K of a {shape} weight)"
        )
    if kind == "int4" and group_size % 2:
        raise ValueError(f"int4 group_size must be even, got {group_size}")
    if kind in PLANE_KINDS and group_size % BLOCK_ROWS:
        raise ValueError(
            f"{kind} group_size must be a multiple of {BLOCK_ROWS} (a block of bit planes), "
            f"got {group_size}"
        )
    if activations != "float" and (
        kind not in INTEGER_ACTIVATION_KINDS[activations]
        or depth % ACTIVATION_GROUP
        or group_size % ACTIVATION_GROUP
    ):
        kinds = " or ".join(INTEGER_ACTIVATION_KINDS[activations])
        raise ValueError(
            f"{activations} activations need an {kinds} weight whose input width and group size "
            f"are multiples of {ACTIVATION_GROUP}, got {kind} {shape} in groups of {group_size}"
        )


def validate_two_level(weight: QuantizedWeight) -> None:
    """``ValueError`` unless two-level codes come with float16 super-block scales (and mins)
    whose rows divide the groups, ``min_codes`` only with ``scale_codes`` and ``mins``, and
    float activations (the integer-activation kernels read one float16 scale per group).
    Leaves that are not arrays (a pytree of shardings, say) are not checked."""
    if weight.scale_codes is None:
        if weight.min_codes is not None:
            raise ValueError("min_codes need scale_codes (two-level scales)")
        return
    if weight.activations != "float":
        raise ValueError(f"two-level scales take float activations, got {weight.activations!r}")
    if not all(
        hasattr(leaf, "shape") and hasattr(leaf, "dtype")
        for leaf in (weight.scales, weight.scale_codes, weight.mins, weight.min_codes)
        if leaf is not None
    ):
        return
    groups = weight.shape[0] // weight.group_size
    supers = weight.scales.shape[0]
    leaves = [(weight.scale_codes, weight.scales)]
    if weight.min_codes is not None or weight.mins is not None:
        if weight.min_codes is None or weight.mins is None:
            raise ValueError("two-level mins need both mins (super-block) and min_codes")
        leaves.append((weight.min_codes, weight.mins))
    for codes, supers_leaf in leaves:  # columns unchecked: a pytree map may pick some
        nibbles = jnp.dtype(codes.dtype) == jnp.uint8  # 4-bit codes, two a byte
        if (
            len(codes.shape) != 2
            or codes.shape[0] * (2 if nibbles else 1) != groups
            or jnp.dtype(codes.dtype) not in (jnp.int8, jnp.uint8)
            or jnp.dtype(supers_leaf.dtype) != jnp.float16
            or supers < 1
            or groups % supers
            or tuple(supers_leaf.shape) != (supers, codes.shape[1])
        ):
            raise ValueError(
                f"two-level scales need int8 codes [{groups}, {weight.shape[1]}] (or uint8 "
                f"[{groups} / 2, {weight.shape[1]}]: 4-bit) and float16 "
                f"super-block scales [{groups} / n, {weight.shape[1]}], got "
                f"{codes.dtype} {tuple(codes.shape)} and {supers_leaf.dtype} "
                f"{tuple(supers_leaf.shape)}"
            )


def validate_codebook(weight: QuantizedWeight) -> None:
    """``ValueError`` unless a codebook is 16 integers in -128..127 of an int4 weight without
    minimums taking float activations."""
    book = weight.codebook
    if book is None:
        return
    if (
        not isinstance(book, tuple)
        or len(book) != 16
        or not all(isinstance(v, int) and -128 <= v <= 127 for v in book)
    ):
        raise ValueError(f"codebook must be a tuple of 16 integers in -128..127, got {book!r}")
    if weight.kind != "int4" or weight.mins is not None or weight.activations != "float":
        raise ValueError(
            f"a codebook indexes an int4 weight without mins taking float activations, got "
            f"{weight.kind}{' with mins' if weight.mins is not None else ''}, activations "
            f"{weight.activations!r}"
        )


def _struct_like(leaf, dtype, shape=None) -> jax.ShapeDtypeStruct:
    """A ``ShapeDtypeStruct`` of ``leaf``'s shape (or ``shape``) and sharding in ``dtype``."""
    sharding = getattr(leaf, "sharding", None)
    return jax.ShapeDtypeStruct(shape or leaf.shape, dtype, sharding=sharding)


def _unpack_int4_jnp(values, depth: int, columns: int) -> jax.Array:  # [K / 2, N] -> [K, N]
    return jnp.stack([values & 0x0F, values >> 4], axis=1).reshape(depth, columns)


def _super_times_codes(supers, codes, per_super: int) -> jax.Array:  # -> [G, N] float32
    """``float32(supers[g // per_super]) * codes[g]`` (exact in float32)."""
    xp = np if isinstance(codes, np.ndarray) and isinstance(supers, np.ndarray) else jnp
    codes = unpack_scale_codes(codes)
    return xp.repeat(xp.asarray(supers).astype(xp.float32), per_super, axis=0) * xp.asarray(
        codes
    ).astype(xp.float32)


def quantize_activations(x: jax.Array, bits: int = 8) -> tuple[jax.Array, jax.Array]:
    """x [..., K] (K a multiple of 32) as ``bits``-bit codes [..., K] (int8 in [-127, 127], or
    int16 in [-32767, 32767]) and float32 scales [..., K / 32], per row and 32 columns: ``s =
    max|x| / L``, ``q = round_half_even(x * (L / max|x|))`` (an all-zero group: codes 0, scale
    0)."""
    levels = jnp.float32(2 ** (bits - 1) - 1)
    x = x.astype(jnp.float32)
    groups = x.reshape(*x.shape[:-1], x.shape[-1] // ACTIVATION_GROUP, ACTIVATION_GROUP)
    largest = jnp.max(jnp.abs(groups), axis=-1, keepdims=True)
    inverse = jnp.where(largest == 0, 0.0, levels / jnp.where(largest == 0, 1.0, largest))
    codes = jnp.clip(jnp.round(groups * inverse), -levels, levels)
    codes = codes.astype(jnp.int8 if bits == 8 else jnp.int16).reshape(x.shape)
    return codes, (largest / levels)[..., 0]


def fake_quantize_activations(x: jax.Array, bits: int = 8) -> jax.Array:
    """The float32 values x's codes stand for: ``s * q`` (:func:`quantize_activations`)."""
    codes, scales = quantize_activations(x, bits)
    groups = codes.reshape(*codes.shape[:-1], -1, ACTIVATION_GROUP).astype(jnp.float32)
    return (groups * scales[..., None]).reshape(codes.shape)


def is_quantized(kernel) -> bool:
    return isinstance(kernel, QuantizedWeight)


def pack_int4(unsigned: np.ndarray) -> np.ndarray:  # [K, N] values in [0, 15] -> [K / 2, N]
    """Two 4-bit codes per byte: row ``2i`` low nibble, row ``2i + 1`` high nibble."""
    unsigned = np.asarray(unsigned, np.uint8)
    return unsigned[0::2] | (unsigned[1::2] << 4)


def unpack_int4(packed: np.ndarray) -> np.ndarray:  # [K / 2, N] -> [K, N] values in [0, 15]
    packed = np.asarray(packed, np.uint8)
    return np.stack([packed & 0x0F, packed >> 4], axis=1).reshape(-1, packed.shape[-1])
