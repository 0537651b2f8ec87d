"""``x @ dequant(W)`` with an int8 or int4 weight streamed from HBM and dequantised in VMEM.

The quantised form of ``kernel``'s streamed matmul: the weight's codes (int8 ``[K, N]``, or int4
packed two rows per byte, ``[K / 2, N]`` uint8) and its per-group scales (and mins) ``[K / g, N]``
stay in HBM and are copied one column block at a time into two-slot VMEM buffers; each block is
dequantised there (codes times their group's scale, plus the min) and multiplied on the MXU.
HBM moves the codes and scales once per step, never a float copy of the weight. The stream, the
norm and the ``pallas_call`` are ``stream``'s, shared with the float kernel.

Scales and mins are float32 or bfloat16, or float16 kept 16-bit in HBM as **packed pairs**
(``float16_pairs``): Mosaic has no float16 vectors on v5e, so the float16 bit patterns (as GGUF
and load-time quantisation store them) of groups ``j`` and ``j + G / 2`` share one int32 word,
``[G / 2, N]``, and the kernel turns them into float32 with integer ops and a bitcast (exact for
every finite float16). Packed scales need an even number of groups; otherwise a backend gives
the weight float32 scales (exact too, 4 bytes a group).

int4: byte ``i`` of a column holds row ``2i`` (low nibble) and ``2i + 1`` (high nibble), so the
product is ``x[:, 0::2] @ dequant(low) + x[:, 1::2] @ dequant(high)``: the two halves of ``x``
are split by XLA beforehand (a few rows) and no nibble interleaving happens in VMEM.

``norm=(weight, eps)`` norms ``x`` in VMEM first, as the float kernel's calls do (both halves
of an int4 call's rows together).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels.tpu.streamed_matmul.elementwise import check_activation
from pallas_kernels.tpu.streamed_matmul.float16_pairs import words_to_float32
from pallas_kernels.tpu.streamed_matmul.stream import StreamRefs, stream_call, validate_norm
from pallas_kernels.tpu.tiling import LANES

# VMEM per column block: two slots of codes and scales plus the dequantised f32 block.
BLOCK_VMEM_BYTES = 16 * 2**20
VMEM_LIMIT = 48 * 2**20


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
    block_columns: int,
    has_mins: bool,
    activation: str | None,
    eps: float | None,
):
    # refs as ``stream`` lays them out: x [M, K] (int8), or x_even, x_odd [M, K / 2] (int4)
    # (with an ``eps``, the norm's weight in the same pieces); each weight's codes, scales[,
    # mins] in HBM (one weight, or gate and up with an ``activation``); out [M, block_columns];
    # the buffers [2, ...] of every leaf; with an ``eps`` the normed x pieces; DMA semaphores.
    per_weight = 2 + has_mins
    num_leaves = per_weight * (1 if activation is None else 2)
    stream = StreamRefs.split(
        refs, num_x=1 if kind == "int8" else 2, num_sources=num_leaves, eps=eps
    )
    slot = stream.next_block(block_columns=block_columns)
    products = [
        _block_product(
            stream.x,
            [buffer[slot] for buffer in stream.buffers[i : i + per_weight]],
            kind=kind,
            has_mins=has_mins,
        )
        for i in range(0, num_leaves, per_weight)
    ]
    stream.write(products, activation)


def _block_product(x_refs, leaves, *, kind: str, has_mins: bool):
    """``x @ dequant(block)`` in float32 for one weight's block of codes, scales[, mins]."""
    codes = leaves[0]  # [K or K / 2, W]
    scales = words_to_float32(leaves[1])  # [G, W]
    mins = words_to_float32(leaves[2]) if has_mins else None
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
    """``act(x @ dequant(gate)) * (x @ dequant(up))`` (``elementwise.gated``), both weights
    streamed side by side; ``activation``: a name in ``GATED_ACTIVATIONS``; ``norm`` as for
    :func:`streamed_matmul_quantized_tpu`."""
    check_activation(activation)
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
    width = streamed_matmul_quantized_plan(
        rows,
        depth,
        columns,
        weight.group_size,
        packed_scales=weight.scales.dtype == jnp.int32,
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
    normed = norm is not None
    kernel = functools.partial(
        _kernel,
        kind=weight.kind,
        block_columns=width,
        has_mins=has_mins,
        activation=activation,
        eps=norm[1] if normed else None,
    )
    vmem = 2 * sum(leaf.shape[0] * width * leaf.dtype.itemsize for leaf in leaves)
    vmem += len(weights) * 6 * depth * width + (4 + normed) * rows * (depth + width) * 4
    name = "streamed_matmul" if activation is None else "streamed_gated_matmul"
    return stream_call(
        kernel,
        halves(x),
        halves(norm[0].reshape(1, depth)) if normed else [],
        leaves,
        [(leaf.shape[0], width) for leaf in leaves],
        columns=columns,
        block_columns=width,
        num_weights=len(weights),
        activation=activation,
        vmem_limit_bytes=min(max(vmem + 8 * 2**20, 16 * 2**20), 100 * 2**20),
        interpret=interpret,
        name=f"{name}_{weight.kind}",
    )
