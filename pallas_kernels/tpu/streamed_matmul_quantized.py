"""``x @ dequant(W)`` with an int8 or int4 weight streamed from HBM and dequantised in VMEM.

The quantised form of ``streamed_matmul``: the weight's codes (int8 ``[K, N]``, or int4 packed
two rows per byte, ``[K / 2, N]`` uint8) and its per-group scales (and mins) ``[K / g, N]`` stay
in HBM and are copied one column block at a time into two-slot VMEM buffers; each block is
dequantised there (codes times their group's scale, plus the min) and multiplied on the MXU.
HBM moves the codes and scales once per step, never a float copy of the weight.

Scales and mins are float32 or bfloat16, or float16 kept 16-bit in HBM as **packed pairs**
(:func:`pack_float16_pairs`): Mosaic has no float16 vectors on v5e, so the float16 bit patterns
(as GGUF and load-time quantisation store them) of groups ``j`` and ``j + G / 2`` share one int32
word, ``[G / 2, N]``, and the kernel turns them into float32 with integer ops and a bitcast
(:func:`float16_bits_to_float32`, exact for every finite float16). Packed scales need an even
number of groups; otherwise a backend gives the weight float32 scales (exact too, 4 bytes a group).

int4: byte ``i`` of a column holds row ``2i`` (low nibble) and ``2i + 1`` (high nibble), so the
product is ``x[:, 0::2] @ dequant(low) + x[:, 1::2] @ dequant(high)``: the two halves of ``x``
are split by XLA beforehand (a few rows) and no nibble interleaving happens in VMEM.

``norm=(weight, eps)`` norms ``x`` in VMEM first, as ``streamed_matmul``'s calls do (both halves
of an int4 call's rows together).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.tpu.streamed_matmul import (
    GATED_ACTIVATIONS,
    LANES,
    gated,
    rms_normed,
    validate_norm,
)

# VMEM per column block: two slots of codes and scales plus the dequantised f32 block.
BLOCK_VMEM_BYTES = 16 * 2**20
VMEM_LIMIT = 48 * 2**20


def pack_float16_pairs(values: jax.Array, pieces: int = 1) -> jax.Array:
    """``[G, N]`` float16 -> ``[G / 2, N]`` int32 words holding the bit patterns of groups ``j``
    (low half) and ``j + G_p / 2`` (high half) of each of ``pieces`` row blocks of ``G_p = G /
    pieces`` groups (one per chip when the groups are split over chips, so each chip's words
    pair its own groups)."""
    groups, columns = values.shape
    if values.dtype != jnp.float16 or groups % (2 * pieces):
        raise ValueError(
            f"values must be float16 with a multiple of {2 * pieces} groups, got "
            f"{values.dtype} {values.shape}"
        )
    bits = jax.lax.bitcast_convert_type(values, jnp.uint16).astype(jnp.uint32)
    bits = bits.reshape(pieces, 2, groups // (2 * pieces), columns)
    words = bits[:, 0] | (bits[:, 1] << 16)
    return jax.lax.bitcast_convert_type(words, jnp.int32).reshape(groups // 2, columns)


def unpack_float16_pairs(words: jax.Array, pieces: int = 1) -> jax.Array:
    """The inverse of :func:`pack_float16_pairs`: ``[G / 2, N]`` int32 -> ``[G, N]`` float16."""
    half, columns = words.shape
    bits = jax.lax.bitcast_convert_type(words, jnp.uint32).reshape(pieces, 1, -1, columns)
    halves = jnp.concatenate([bits & 0xFFFF, bits >> 16], axis=1).astype(jnp.uint16)
    return jax.lax.bitcast_convert_type(halves, jnp.float16).reshape(2 * half, columns)


def float16_bits_to_float32(bits: jax.Array) -> jax.Array:
    """float16 bit patterns (int32 in ``[0, 2**16)``) as float32, exactly, with integer ops and
    a bitcast (no float16 vectors): normals move their exponent and mantissa into float32's
    fields, subnormals are ``mantissa * 2**-24``. Infinities and NaNs are not handled (scales
    are finite)."""
    sign = (bits & 0x8000) << 16
    exponent = (bits >> 10) & 0x1F
    mantissa = bits & 0x3FF
    normal = jax.lax.bitcast_convert_type(
        sign | ((exponent + 112) << 23) | (mantissa << 13), jnp.float32
    )
    subnormal = mantissa.astype(jnp.float32) * (2.0**-24)
    subnormal = jnp.where(sign != 0, -subnormal, subnormal)
    return jnp.where(exponent == 0, subnormal, normal)


def streamed_matmul_quantized_plan(
    rows: int,
    depth: int,
    columns: int,
    group_size: int,
    *,
    packed_scales: bool = False,
    num_weights: int = 1,
    normed: bool = False,
):
    """Columns per block for ``[rows, depth] @ dequant([depth, columns])`` (``num_weights`` of
    them streamed side by side; ``normed``: x normed in VMEM first), or None when the kernel
    does not fit (columns not a multiple of 128, groups not whole sublane tiles, an odd number
    of groups for ``packed_scales``, or ``x`` too large for VMEM)."""
    if columns % LANES or group_size % 16 or depth % group_size:
        return None
    if packed_scales and (depth // group_size) % 2:
        return None
    # codes, scales, f32
    per_column = num_weights * (2 * depth + 2 * 4 * (depth // group_size) * 2 + 6 * depth)
    candidates = [
        width
        for width in range(LANES, columns + 1, LANES)
        if columns % width == 0 and width * per_column <= BLOCK_VMEM_BYTES
    ]
    # x, double-buffered, and its normed copy
    if not candidates or (2 + normed) * rows * depth * 4 > VMEM_LIMIT // 3:
        return None
    return max(candidates)


def _kernel(
    *refs,
    kind: str,
    group_size: int,
    block_columns: int,
    has_mins: bool,
    activation: str | None,
    eps: float | None,
):
    # x_refs: [M, K] (int8), or x_even, x_odd [M, K / 2] (int4); with an ``eps``, the norm's
    # weight in the same pieces ([1, K], or [1, K / 2] twice); then each weight's codes,
    # scales[, mins] in HBM (one weight, or gate and up with an ``activation``); out_ref
    # [M, block_columns]; then the buffers [2, ...] of every leaf, with an ``eps`` the normed
    # x pieces, and DMA semaphores [leaves].
    num_x = 1 if kind == "int8" else 2
    normed = eps is not None
    num_leaves = (2 + has_mins) * (1 if activation is None else 2)
    x_refs = refs[:num_x]
    norm_refs, refs = (refs[num_x : 2 * num_x], refs[2 * num_x :]) if normed else ((), refs[num_x:])
    hbm = refs[:num_leaves]
    out_ref = refs[num_leaves]
    buffers = refs[num_leaves + 1 : 2 * num_leaves + 1]
    semaphores = refs[-1]
    block, num_blocks = pl.program_id(0), pl.num_programs(0)

    def copies(index, slot):
        start = pl.multiple_of(index * block_columns, LANES)
        columns = pl.ds(start, block_columns)
        return [
            pltpu.make_async_copy(src.at[:, columns], buf.at[slot], semaphores.at[i])
            for i, (src, buf) in enumerate(zip(hbm, buffers, strict=True))
        ]

    @pl.when(block == 0)
    def _():
        for copy in copies(0, 0):
            copy.start()

    if normed:  # once, while the first blocks are in flight; every block reads the result
        normed_refs = refs[2 * num_leaves + 1 : 2 * num_leaves + 1 + num_x]

        @pl.when(block == 0)
        def _():
            depth = sum(x.shape[1] for x in x_refs)
            pieces = rms_normed([x[...] for x in x_refs], [w[...] for w in norm_refs], eps, depth)
            for normed_ref, piece in zip(normed_refs, pieces, strict=True):
                normed_ref[...] = piece

        x_refs = normed_refs

    slot = block % 2
    for copy in copies(block, slot):
        copy.wait()

    @pl.when(block + 1 < num_blocks)
    def _():
        for copy in copies(block + 1, 1 - slot):
            copy.start()

    per_weight = 2 + has_mins
    products = [
        _block_product(
            x_refs,
            [buffer[slot] for buffer in buffers[i : i + per_weight]],
            kind=kind,
            has_mins=has_mins,
        )
        for i in range(0, num_leaves, per_weight)
    ]
    if activation is None:
        out_ref[...] = products[0].astype(out_ref.dtype)
    else:
        out_ref[...] = gated(*products, activation, out_ref.dtype)


def _block_product(x_refs, leaves, *, kind: str, has_mins: bool):
    """``x @ dequant(block)`` in float32 for one weight's block of codes, scales[, mins]."""
    codes = leaves[0]  # [K or K / 2, W]

    def as_float32(buffer):  # [G, W] float, or [G / 2, W] packed float16 pairs -> [G, W] f32
        if buffer.dtype != jnp.int32:
            return buffer.astype(jnp.float32)
        low = float16_bits_to_float32(buffer & 0xFFFF)
        high = float16_bits_to_float32((buffer >> 16) & 0xFFFF)
        return jnp.concatenate([low, high], axis=0)

    scales = as_float32(leaves[1])  # [G, W]
    mins = as_float32(leaves[2]) if has_mins else None
    groups, width = scales.shape

    def dequantize(unsigned_or_signed):  # [rows, W] codes of one half -> x's dtype
        rows_per_group = unsigned_or_signed.shape[0] // groups
        grouped = unsigned_or_signed.astype(jnp.float32).reshape(groups, rows_per_group, width)
        weight = grouped * scales[:, None, :]
        if mins is not None:
            weight = weight + mins[:, None, :]
        return weight.reshape(groups * rows_per_group, width).astype(x_refs[0].dtype)

    if kind == "int8":
        return jnp.dot(x_refs[0][...], dequantize(codes), preferred_element_type=jnp.float32)
    packed = codes.astype(jnp.int32)
    low, high = packed & 0x0F, packed >> 4
    if not has_mins:  # symmetric: s * (u - 8)
        low, high = low - 8, high - 8
    product = jnp.dot(x_refs[0][...], dequantize(low), preferred_element_type=jnp.float32)
    return product + jnp.dot(x_refs[1][...], dequantize(high), preferred_element_type=jnp.float32)


def streamed_matmul_quantized_tpu(
    x: jax.Array,  # [M, K]
    weight,  # QuantizedWeight, kind int8 or int4, [K, N]; scales (mins) [G, N] or packed [G / 2, N]
    *,
    norm: tuple | None = None,
    interpret=False,
) -> jax.Array:  # [M, N], x's dtype
    """``x @ weight.dequantize()`` with the codes and scales streamed from HBM (module
    docstring); ``norm``: ``(weight [K], eps)`` to multiply ``rms_norm(x)`` instead.
    ``interpret``: False, or ``pltpu.InterpretParams`` to run on CPU."""
    return _quantized_call(x, (weight,), activation=None, norm=norm, interpret=interpret)


def streamed_gated_matmul_quantized_tpu(
    x: jax.Array,  # [M, K]
    gate,  # QuantizedWeight [K, N], as for streamed_matmul_quantized_tpu
    up,  # QuantizedWeight [K, N], of gate's kind, group size and scale layout
    *,
    activation: str = "silu",
    norm: tuple | None = None,
    interpret=False,
) -> jax.Array:  # [M, N], x's dtype
    """``act(x @ dequant(gate)) * (x @ dequant(up))`` (``streamed_matmul.gated``), both
    weights streamed side by side; ``activation``: a name in ``GATED_ACTIVATIONS``; ``norm`` as
    for :func:`streamed_matmul_quantized_tpu`."""
    if activation not in GATED_ACTIVATIONS:
        raise ValueError(
            f"activation must be one of {', '.join(map(repr, GATED_ACTIVATIONS))}, "
            f"got {activation!r}"
        )
    layout = [(w.kind, w.shape, w.group_size, w.scales.dtype, w.mins is None) for w in (gate, up)]
    if layout[0] != layout[1]:
        raise ValueError(
            "gate and up must share kind, shape, group size and scale layout, got "
            f"{layout[0]} and {layout[1]}"
        )
    return _quantized_call(x, (gate, up), activation=activation, norm=norm, interpret=interpret)


def _validate(x, weight):
    """A ValueError for an ``x`` or ``weight`` the kernel cannot take."""
    if weight.kind not in ("int8", "int4"):
        raise ValueError(f"weight.kind must be 'int8' or 'int4', got {weight.kind!r}")
    depth, columns = weight.shape
    if x.ndim != 2 or x.shape[1] != depth:
        raise ValueError(f"x must be [M, {depth}] for a {weight.shape} weight, got {x.shape}")
    groups = depth // weight.group_size
    packed = weight.scales.dtype == jnp.int32
    for name, leaf in (("scales", weight.scales), ("mins", weight.mins)):
        if leaf is None:
            continue
        if leaf.dtype not in (jnp.float32, jnp.bfloat16, jnp.int32) or (
            (leaf.dtype == jnp.int32) != packed
        ):
            raise ValueError(
                f"weight.{name} must be float32 or bfloat16, or int32 packed float16 pairs "
                f"(pack_float16_pairs) like weight.scales, got {leaf.dtype}"
            )
        expected = (groups // 2 if packed else groups, columns)
        if packed and groups % 2:
            raise ValueError(
                f"weight.{name}: packed float16 pairs need an even number of groups, got {groups}"
            )
        if leaf.shape != expected:
            raise ValueError(f"weight.{name} must be {expected}, got {leaf.shape}")


def _quantized_call(x, weights, *, activation, norm, interpret):
    for weight in weights:
        _validate(x, weight)
    validate_norm(norm, x)
    weight = weights[0]
    depth, columns = weight.shape
    rows = x.shape[0]
    packed = weight.scales.dtype == jnp.int32
    width = streamed_matmul_quantized_plan(
        rows,
        depth,
        columns,
        weight.group_size,
        packed_scales=packed,
        num_weights=len(weights),
        normed=norm is not None,
    )
    if width is None:
        raise ValueError(
            f"x {x.shape} @ {weight.kind} weight {weight.shape} (group {weight.group_size}) does "
            "not fit the quantised streamed matmul (see streamed_matmul_quantized_plan)"
        )
    has_mins = weight.mins is not None
    leaves = [
        leaf for w in weights for leaf in [w.values, w.scales] + ([w.mins] if has_mins else [])
    ]
    halves = (lambda a: [a]) if weight.kind == "int8" else (lambda a: [a[..., 0::2], a[..., 1::2]])
    xs = halves(x)
    normed = norm is not None
    norm_inputs = halves(norm[0].reshape(1, depth)) if normed else []
    leaf_bytes = sum(leaf.size * leaf.dtype.itemsize for leaf in leaves)
    cost = pl.CostEstimate(
        flops=2 * len(weights) * rows * depth * columns + normed * 4 * rows * depth,
        transcendentals=(0 if activation is None else rows * columns) + normed * rows,
        bytes_accessed=leaf_bytes
        + (rows * depth + rows * columns + normed * depth) * x.dtype.itemsize,
    )
    hbm = pltpu.HBM
    kernel = functools.partial(
        _kernel,
        kind=weight.kind,
        group_size=weight.group_size,
        block_columns=width,
        has_mins=has_mins,
        activation=activation,
        eps=norm[1] if normed else None,
    )
    vmem = 2 * sum(leaf.shape[0] * width * leaf.dtype.itemsize for leaf in leaves)
    vmem += len(weights) * 6 * depth * width + (4 + normed) * rows * (depth + width) * 4
    name = "streamed_matmul" if activation is None else "streamed_gated_matmul"
    return pl.pallas_call(
        kernel,
        grid=(columns // width,),
        in_specs=[pl.BlockSpec(a.shape, lambda block: (0, 0)) for a in xs + norm_inputs]
        + [pl.BlockSpec(memory_space=hbm)] * len(leaves),
        out_specs=pl.BlockSpec((rows, width), lambda block: (0, block)),
        out_shape=jax.ShapeDtypeStruct((rows, columns), x.dtype),
        scratch_shapes=[pltpu.VMEM((2, leaf.shape[0], width), leaf.dtype) for leaf in leaves]
        + [pltpu.VMEM(a.shape, a.dtype) for a in xs] * normed
        + [pltpu.SemaphoreType.DMA((len(leaves),))],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("arbitrary",),
            vmem_limit_bytes=min(max(vmem + 8 * 2**20, 16 * 2**20), 100 * 2**20),
        ),
        cost_estimate=cost,
        interpret=interpret,
        name=f"{name}_{weight.kind}",
    )(
        *xs,
        *norm_inputs,
        *(leaf if interpret else pltpu.with_memory_space_constraint(leaf, hbm) for leaf in leaves),
    )
