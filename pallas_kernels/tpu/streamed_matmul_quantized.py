"""``x @ dequant(W)`` with an int8 or int4 weight streamed from HBM and dequantised in VMEM.

The quantised form of ``streamed_matmul``: the weight's codes (int8 ``[K, N]``, or int4 packed
two rows per byte, ``[K / 2, N]`` uint8) and its per-group scales (and mins) ``[K / g, N]`` stay
in HBM and are copied one column block at a time into two-slot VMEM buffers; each block is
dequantised there (codes times their group's scale, plus the min) and multiplied on the MXU.
HBM moves the codes and scales once per step, never a float copy of the weight. Scales and mins
must be float32 (or bfloat16): Mosaic has no float16 vectors on v5e, so a float16-scaled weight
(as GGUF and load-time quantisation store them) is given float32 scales once, exactly, when a
backend prepares its parameters.

int4: byte ``i`` of a column holds row ``2i`` (low nibble) and ``2i + 1`` (high nibble), so the
product is ``x[:, 0::2] @ dequant(low) + x[:, 1::2] @ dequant(high)``: the two halves of ``x``
are split by XLA beforehand (a few rows) and no nibble interleaving happens in VMEM.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.tpu.streamed_matmul import LANES

# VMEM per column block: two slots of codes and scales plus the dequantised f32 block.
BLOCK_VMEM_BYTES = 16 * 2**20
VMEM_LIMIT = 48 * 2**20


def streamed_matmul_quantized_plan(rows: int, depth: int, columns: int, group_size: int):
    """Columns per block for ``[rows, depth] @ dequant([depth, columns])``, or None when the
    kernel does not fit (columns not a multiple of 128, groups not whole sublane tiles, or
    ``x`` too large for VMEM)."""
    if columns % LANES or group_size % 16 or depth % group_size:
        return None
    per_column = 2 * depth + 2 * 4 * (depth // group_size) * 2 + 6 * depth  # codes, scales, f32
    candidates = [
        width
        for width in range(LANES, columns + 1, LANES)
        if columns % width == 0 and width * per_column <= BLOCK_VMEM_BYTES
    ]
    if not candidates or 2 * rows * depth * 4 > VMEM_LIMIT // 3:  # x, double-buffered
        return None
    return max(candidates)


def _kernel(*refs, kind: str, group_size: int, block_columns: int, has_mins: bool):
    # x_refs: [M, K] (int8), or x_even, x_odd [M, K / 2] (int4); then codes, scales[, mins] in
    # HBM; out_ref [M, block_columns]; then the buffers [2, ...] and DMA semaphores [3].
    num_x = 1 if kind == "int8" else 2
    x_refs = refs[:num_x]
    hbm = refs[num_x : num_x + 2 + has_mins]
    out_ref = refs[num_x + 2 + has_mins]
    buffers = refs[num_x + 3 + has_mins : num_x + 5 + 2 * has_mins]
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

    slot = block % 2
    for copy in copies(block, slot):
        copy.wait()

    @pl.when(block + 1 < num_blocks)
    def _():
        for copy in copies(block + 1, 1 - slot):
            copy.start()

    codes = buffers[0][slot]  # [K or K / 2, W]
    scales = buffers[1][slot].astype(jnp.float32)  # [G, W]
    mins = buffers[2][slot].astype(jnp.float32) if has_mins else None
    groups, width = scales.shape

    def dequantize(unsigned_or_signed):  # [rows, W] codes of one half -> x's dtype
        rows_per_group = unsigned_or_signed.shape[0] // groups
        grouped = unsigned_or_signed.astype(jnp.float32).reshape(groups, rows_per_group, width)
        weight = grouped * scales[:, None, :]
        if mins is not None:
            weight = weight + mins[:, None, :]
        return weight.reshape(groups * rows_per_group, width).astype(x_refs[0].dtype)

    if kind == "int8":
        product = jnp.dot(x_refs[0][...], dequantize(codes), preferred_element_type=jnp.float32)
    else:
        packed = codes.astype(jnp.int32)
        low, high = packed & 0x0F, packed >> 4
        if not has_mins:  # symmetric: s * (u - 8)
            low, high = low - 8, high - 8
        product = jnp.dot(x_refs[0][...], dequantize(low), preferred_element_type=jnp.float32)
        product += jnp.dot(x_refs[1][...], dequantize(high), preferred_element_type=jnp.float32)
    out_ref[...] = product.astype(out_ref.dtype)


def streamed_matmul_quantized_tpu(
    x: jax.Array,  # [M, K]
    weight,  # QuantizedWeight, kind int8 or int4, [K, N]
    *,
    interpret=False,
) -> jax.Array:  # [M, N], x's dtype
    """``x @ weight.dequantize()`` with the codes and scales streamed from HBM (module
    docstring). ``interpret``: False, or ``pltpu.InterpretParams`` to run on CPU."""
    if weight.kind not in ("int8", "int4"):
        raise ValueError(f"weight.kind must be 'int8' or 'int4', got {weight.kind!r}")
    depth, columns = weight.shape
    if x.ndim != 2 or x.shape[1] != depth:
        raise ValueError(f"x must be [M, {depth}] for a {weight.shape} weight, got {x.shape}")
    rows = x.shape[0]
    width = streamed_matmul_quantized_plan(rows, depth, columns, weight.group_size)
    if width is None:
        raise ValueError(
            f"x {x.shape} @ {weight.kind} weight {weight.shape} (group {weight.group_size}) does "
            "not fit the quantised streamed matmul (see streamed_matmul_quantized_plan)"
        )
    has_mins = weight.mins is not None
    leaves = [weight.values, weight.scales] + ([weight.mins] if has_mins else [])
    for name, leaf in (("scales", weight.scales), ("mins", weight.mins)):
        if leaf is not None and leaf.dtype not in (jnp.float32, jnp.bfloat16):
            raise ValueError(f"weight.{name} must be float32 or bfloat16, got {leaf.dtype}")
    xs = [x] if weight.kind == "int8" else [x[:, 0::2], x[:, 1::2]]
    leaf_bytes = sum(leaf.size * leaf.dtype.itemsize for leaf in leaves)
    cost = pl.CostEstimate(
        flops=2 * rows * depth * columns,
        transcendentals=0,
        bytes_accessed=leaf_bytes + (rows * depth + rows * columns) * x.dtype.itemsize,
    )
    hbm = pltpu.HBM
    kernel = functools.partial(
        _kernel,
        kind=weight.kind,
        group_size=weight.group_size,
        block_columns=width,
        has_mins=has_mins,
    )
    vmem = 2 * sum(leaf.shape[0] * width * leaf.dtype.itemsize for leaf in leaves)
    vmem += 6 * depth * width + 4 * rows * (depth + width) * 4
    return pl.pallas_call(
        kernel,
        grid=(columns // width,),
        in_specs=[pl.BlockSpec(a.shape, lambda block: (0, 0)) for a in xs]
        + [pl.BlockSpec(memory_space=hbm)] * len(leaves),
        out_specs=pl.BlockSpec((rows, width), lambda block: (0, block)),
        out_shape=jax.ShapeDtypeStruct((rows, columns), x.dtype),
        scratch_shapes=[pltpu.VMEM((2, leaf.shape[0], width), leaf.dtype) for leaf in leaves]
        + [pltpu.SemaphoreType.DMA((3,))],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("arbitrary",),
            vmem_limit_bytes=min(max(vmem + 8 * 2**20, 16 * 2**20), 100 * 2**20),
        ),
        cost_estimate=cost,
        interpret=interpret,
        name=f"streamed_matmul_{weight.kind}",
    )(
        *xs,
        *(leaf if interpret else pltpu.with_memory_space_constraint(leaf, hbm) for leaf in leaves),
    )
