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

Either call may take ``norm=(weight, eps)``: ``x`` is then the un-normed input of an RMSNorm
whose output the product reads, and the kernel norms it in VMEM once (:func:`rms_normed`) before
the first block, so the normed rows never go to HBM and back (XLA writes them and every
projection reads them).
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
    rows: int,
    depth: int,
    columns: int,
    itemsize: int,
    *,
    num_weights: int = 1,
    normed: bool = False,
):
    """The sizing for ``[rows, depth] @ [depth, columns]`` (``num_weights`` of them streamed side
    by side; ``normed``: x normed in VMEM first), or None when the kernel does not fit (``x``
    too large for VMEM, or no column block that tiles ``columns``)."""
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
        + normed * (rows * depth * itemsize + depth * itemsize)  # normed x, the norm's weight
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


def rms_normed(parts: list, weights: list, eps: float, depth: int) -> list:
    """RMSNorm of rows held in ``parts`` ([M, K_i] each, together the ``depth`` elements of a
    row; ``weights``: the norm's [1, K_i] pieces), as ``jaxgen.models.linear.rms_norm`` rounds it:
    ``x / rms(x)`` in float32 rounded to x's dtype, times the weight, rounded again."""
    dtype = parts[0].dtype
    floats = [part.astype(jnp.float32) for part in parts]
    squares = sum(jnp.sum(part * part, axis=-1, keepdims=True) for part in floats)
    inverse = jax.lax.rsqrt(squares / depth + eps)  # [M, 1]
    return [
        ((part * inverse).astype(dtype).astype(jnp.float32) * w.astype(jnp.float32)).astype(dtype)
        for part, w in zip(floats, weights, strict=True)
    ]


def streamed_matmul_kernel(
    x_ref,
    *refs,
    block_columns: int,
    single_block: bool,
    transposed: bool,
    activation: str | None = None,
    eps: float | None = None,
):
    # x_ref: [M, K]; with an ``eps``, the norm's weight [1, K]; then the weights in HBM, [K, N]
    # ([N, K] transposed): one, or gate and up with an ``activation``; out_ref: [M,
    # block_columns]; a buffer per weight, [2, K, block_columns] ([2, block_columns, K]
    # transposed); with an ``eps``, the normed x [M, K]; DMA semaphores [2 * weights].
    num_weights = 1 if activation is None else 2
    normed = eps is not None
    norm_ref, refs = (refs[0], refs[1:]) if normed else (None, refs)
    w_hbms, out_ref = refs[:num_weights], refs[num_weights]
    buffers = refs[num_weights + 1 : 2 * num_weights + 1]
    semaphores = refs[-1]
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

    if normed:  # once, while the first blocks are in flight; every block reads the result
        normed_ref = refs[2 * num_weights + 1]

        @pl.when(block == 0)
        def _():
            depth = x_ref.shape[1]
            normed_ref[...] = rms_normed([x_ref[...]], [norm_ref[...]], eps, depth)[0]

        x_ref = normed_ref

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
    norm: tuple | None = None,
    interpret=False,
) -> jax.Array:  # [M, N], x's dtype
    """``x @ w`` (``x @ w.T`` when ``transposed``) with ``w`` streamed from HBM (module
    docstring); ``norm``: ``(weight [K], eps)`` to multiply ``rms_norm(x)`` instead.
    ``interpret``: False, or ``pltpu.InterpretParams`` to run on CPU."""
    return _streamed_call(
        x, (w,), transposed=transposed, activation=None, norm=norm, interpret=interpret
    )


def streamed_gated_matmul_tpu(
    x: jax.Array,  # [M, K]
    gate: jax.Array,  # [K, N]
    up: jax.Array,  # [K, N]
    *,
    activation: str = "silu",
    norm: tuple | None = None,
    interpret=False,
) -> jax.Array:  # [M, N], x's dtype
    """``act(x @ gate) * (x @ up)`` (:func:`gated`) with both weights streamed from HBM side by
    side; ``activation``: a name in ``GATED_ACTIVATIONS``; ``norm`` as for
    :func:`streamed_matmul_tpu`."""
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
        x, (gate, up), transposed=False, activation=activation, norm=norm, interpret=interpret
    )


def validate_norm(norm, x) -> None:
    """A ValueError for a ``norm`` argument that is not ``(weight [K], eps)`` for this ``x``."""
    if norm is None:
        return
    if not isinstance(norm, tuple) or len(norm) != 2:
        raise ValueError(f"norm must be None or (weight, eps), got {type(norm).__name__}")
    weight, eps = norm
    if weight.shape != (x.shape[1],) or weight.dtype != x.dtype:
        raise ValueError(
            f"norm's weight must be [{x.shape[1]}] {x.dtype} like x's rows, got "
            f"{weight.shape} {weight.dtype}"
        )
    if not isinstance(eps, float) or eps <= 0:
        raise ValueError(f"norm's eps must be a positive float, got {eps!r}")


def _streamed_call(x, weights, *, transposed, activation, norm, interpret):
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
    validate_norm(norm, x)
    rows, itemsize = x.shape[0], jnp.dtype(x.dtype).itemsize
    num_weights = len(weights)
    plan = streamed_matmul_plan(
        rows, depth, columns, itemsize, num_weights=num_weights, normed=norm is not None
    )
    if plan is None:
        raise ValueError(
            f"x {x.shape} @ w {w.shape} does not fit the streamed matmul's VMEM budget "
            "(see streamed_matmul_plan); use jnp.dot"
        )
    width = plan.block_columns
    buffer_block = (width, depth) if transposed else (depth, width)
    normed = norm is not None
    cost = pl.CostEstimate(
        flops=2 * num_weights * rows * depth * columns + normed * 4 * rows * depth,
        transcendentals=(0 if activation is None else rows * columns) + normed * rows,
        bytes_accessed=(
            num_weights * depth * columns + rows * depth + rows * columns + normed * depth
        )
        * itemsize,
    )
    norm_inputs = [norm[0].reshape(1, depth)] if normed else []
    return pl.pallas_call(
        functools.partial(
            streamed_matmul_kernel,
            block_columns=width,
            single_block=width == columns,
            transposed=transposed,
            activation=activation,
            eps=norm[1] if normed else None,
        ),
        grid=(columns // width,),
        in_specs=[pl.BlockSpec((rows, depth), lambda block: (0, 0))]
        + [pl.BlockSpec((1, depth), lambda block: (0, 0))] * normed
        + [pl.BlockSpec(memory_space=pltpu.HBM)] * num_weights,
        out_specs=pl.BlockSpec((rows, width), lambda block: (0, block)),
        out_shape=jax.ShapeDtypeStruct((rows, columns), x.dtype),
        scratch_shapes=[pltpu.VMEM((2, *buffer_block), w.dtype)] * num_weights
        + [pltpu.VMEM((rows, depth), x.dtype)] * normed
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
        *norm_inputs,
        *(
            weight if interpret else pltpu.with_memory_space_constraint(weight, pltpu.HBM)
            for weight in weights
        ),
    )
