"""A matmul whose weight stays in HBM and is streamed through VMEM, column block by column block.

``x @ w`` for the decode step's projections: ``x`` ([M, K], a few rows) sits in VMEM whole, and
``w`` ([K, N], or [N, K] stored transposed, as an embedding used as the LM head is) is left in
HBM (``memory_space=ANY``) and copied one column block at a time into a two-slot VMEM buffer,
the next block's DMA started before the current block's product. Each weight byte is read once.

Why not XLA's dot: XLA prefetches a dot's weight into VMEM itself and its ``cost_analysis``
counts a decode-sized dot at several times the weight bytes (a ``[64, 2048] @ [2048, 8192]``
dot: 5.0x); with the weight in HBM and an honest ``pl.CostEstimate``, the compiler counts what
the kernel moves. For many rows (prefill) the product is compute-bound and XLA's dot is the
right tool: :func:`streamed_matmul_plan` says when this kernel fits.

:func:`streamed_gated_matmul_tpu` is the gated MLP's first half in one call: ``act(x @ gate) *
(x @ up)``, the two weights streamed side by side, so neither product leaves VMEM (XLA writes
both and reads them back for the activation and the product).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

LANES = 128
# VMEM for one slot of the weight buffer; the call asks for what it needs (two slots, x, out)
# under VMEM_LIMIT, below the 95-128 MiB of VMEM of v5e, v5p and v6e chips.
WEIGHT_BLOCK_BYTES = 4 * 2**20
VMEM_LIMIT = 48 * 2**20


@dataclasses.dataclass(frozen=True)
class StreamedMatmulPlan:
    """The static sizing of one call: ``block_columns`` of the weight per grid step, and the
    VMEM the call needs."""

    block_columns: int
    vmem_bytes: int


# The gated MLP's activations the gated kernel computes (``jaxgen.models.mlp``'s names).
GATED_ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
}


def streamed_matmul_plan(
    rows: int, depth: int, columns: int, itemsize: int, *, num_weights: int = 1
):
    """The sizing for ``[rows, depth] @ [depth, columns]`` (``num_weights`` of them streamed side
    by side), or None when the kernel does not fit (``x`` too large for VMEM, or no column
    block that tiles ``columns``)."""
    slot_bytes = WEIGHT_BLOCK_BYTES // num_weights
    candidates = [
        width
        for width in range(LANES, columns + 1, LANES)
        if columns % width == 0 and depth * width * itemsize <= slot_bytes
    ]
    if not candidates and columns % LANES and depth * columns * itemsize <= slot_bytes:
        candidates = [columns]  # one block as wide as the weight: allowed at any width
    if not candidates:
        return None
    width = max(candidates)
    vmem = (
        2 * rows * depth * itemsize  # x (double-buffered by the pipeline)
        + 2 * num_weights * depth * width * itemsize  # each weight's two slots
        + 2 * rows * width * itemsize  # out
        + num_weights * rows * width * 4  # the f32 products
    )
    if vmem > VMEM_LIMIT:
        return None
    return StreamedMatmulPlan(block_columns=width, vmem_bytes=vmem)


def gated(gate, up, activation: str, dtype):
    """``act(gate) * up`` of two float32 products, each first rounded to ``dtype`` as the
    unfused layers' outputs are; computed in float32, rounded once."""
    gate = gate.astype(dtype).astype(jnp.float32)
    up = up.astype(dtype).astype(jnp.float32)
    return (GATED_ACTIVATIONS[activation](gate) * up).astype(dtype)


def streamed_matmul_kernel(
    x_ref,
    *refs,
    block_columns: int,
    single_block: bool,
    transposed: bool,
    activation: str | None = None,
):
    # x_ref: [M, K]; refs: the weights in HBM, [K, N] ([N, K] transposed): one, or gate and up
    # with an ``activation``; out_ref: [M, block_columns]; a buffer per weight, [2, K,
    # block_columns] ([2, block_columns, K] transposed); DMA semaphores [2 * weights].
    num_weights = 1 if activation is None else 2
    w_hbms, out_ref = refs[:num_weights], refs[num_weights]
    buffers, semaphores = refs[num_weights + 1 : 2 * num_weights + 1], refs[-1]
    block, num_blocks = pl.program_id(0), pl.num_programs(0)

    def copies(index, slot):
        if single_block:  # as wide as the weight, of any width
            start = 0
        else:  # blocks of a multiple of 128 columns
            start = pl.multiple_of(index * block_columns, LANES)
        columns = pl.ds(start, block_columns)
        return [
            pltpu.make_async_copy(
                w_hbm.at[columns, :] if transposed else w_hbm.at[:, columns],
                buffer.at[slot],
                semaphores.at[2 * i + slot],
            )
            for i, (w_hbm, buffer) in enumerate(zip(w_hbms, buffers, strict=True))
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

    contract = ((1,), (1,)) if transposed else ((1,), (0,))
    products = [
        jax.lax.dot_general(
            x_ref[...], buffer[slot], (contract, ((), ())), preferred_element_type=jnp.float32
        )
        for buffer in buffers
    ]
    if activation is None:
        out_ref[...] = products[0].astype(out_ref.dtype)
    else:
        out_ref[...] = gated(*products, activation, out_ref.dtype)


def streamed_matmul_tpu(
    x: jax.Array,  # [M, K]
    w: jax.Array,  # [K, N], or [N, K] when transposed
    *,
    transposed: bool = False,
    interpret=False,
) -> jax.Array:  # [M, N], x's dtype
    """``x @ w`` (``x @ w.T`` when ``transposed``) with ``w`` streamed from HBM (module
    docstring). ``interpret``: False, or ``pltpu.InterpretParams`` to run on CPU."""
    return _streamed_call(x, (w,), transposed=transposed, activation=None, interpret=interpret)


def streamed_gated_matmul_tpu(
    x: jax.Array,  # [M, K]
    gate: jax.Array,  # [K, N]
    up: jax.Array,  # [K, N]
    *,
    activation: str = "silu",
    interpret=False,
) -> jax.Array:  # [M, N], x's dtype
    """``act(x @ gate) * (x @ up)`` (:func:`gated`) with both weights streamed from HBM side by
    side; ``activation``: a name in ``GATED_ACTIVATIONS``."""
    if activation not in GATED_ACTIVATIONS:
        raise ValueError(
            f"activation must be one of {', '.join(map(repr, GATED_ACTIVATIONS))}, "
            f"got {activation!r}"
        )
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(
            f"gate and up must share a shape and dtype, got {gate.shape} {gate.dtype} and "
            f"{up.shape} {up.dtype}"
        )
    return _streamed_call(
        x, (gate, up), transposed=False, activation=activation, interpret=interpret
    )


def _streamed_call(x, weights, *, transposed, activation, interpret):
    w = weights[0]
    if x.ndim != 2 or w.ndim != 2:
        raise ValueError(f"x and w must be 2-D, got x {x.shape} and w {w.shape}")
    columns, depth = w.shape if transposed else w.shape[::-1]
    if x.shape[1] != depth:
        raise ValueError(
            f"x's last dimension {x.shape[1]} must equal w's depth {depth} "
            f"(w {w.shape}, transposed={transposed})"
        )
    if x.dtype != w.dtype:
        raise ValueError(f"x and w must share a dtype, got {x.dtype} and {w.dtype}")
    rows, itemsize = x.shape[0], jnp.dtype(x.dtype).itemsize
    num_weights = len(weights)
    plan = streamed_matmul_plan(rows, depth, columns, itemsize, num_weights=num_weights)
    if plan is None:
        raise ValueError(
            f"x {x.shape} @ w {w.shape} does not fit the streamed matmul's VMEM budget "
            "(see streamed_matmul_plan); use jnp.dot"
        )
    width = plan.block_columns
    buffer_block = (width, depth) if transposed else (depth, width)
    cost = pl.CostEstimate(
        flops=2 * num_weights * rows * depth * columns,
        transcendentals=0 if activation is None else rows * columns,
        bytes_accessed=(num_weights * depth * columns + rows * depth + rows * columns) * itemsize,
    )
    return pl.pallas_call(
        functools.partial(
            streamed_matmul_kernel,
            block_columns=width,
            single_block=width == columns,
            transposed=transposed,
            activation=activation,
        ),
        grid=(columns // width,),
        in_specs=[pl.BlockSpec((rows, depth), lambda block: (0, 0))]
        + [pl.BlockSpec(memory_space=pltpu.HBM)] * num_weights,
        out_specs=pl.BlockSpec((rows, width), lambda block: (0, block)),
        out_shape=jax.ShapeDtypeStruct((rows, columns), x.dtype),
        scratch_shapes=[pltpu.VMEM((2, *buffer_block), w.dtype)] * num_weights
        + [pltpu.SemaphoreType.DMA((2 * num_weights,))],
        # Sequential: each grid step waits on the DMA the previous one started.
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("arbitrary",),
            vmem_limit_bytes=max(plan.vmem_bytes + 4 * 2**20, 16 * 2**20),
        ),
        cost_estimate=cost,
        interpret=interpret,
        name="streamed_matmul_kernel" if activation is None else "streamed_gated_matmul",
    )(
        x,
        *(
            weight if interpret else pltpu.with_memory_space_constraint(weight, pltpu.HBM)
            for weight in weights
        ),
    )
