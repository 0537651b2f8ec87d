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
whose output the product reads, and the kernel norms it in VMEM once (``elementwise.rms_normed``)
before the first block, so the normed rows never go to HBM and back (XLA writes them and every
projection reads them). The stream, the norm and the ``pallas_call`` are ``stream``'s, shared
with the quantised kernel (``quantized``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from pallas_kernels.tpu.streamed_matmul.elementwise import check_activation
from pallas_kernels.tpu.streamed_matmul.stream import StreamRefs, stream_call, validate_norm
from pallas_kernels.tpu.tiling import LANES

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


def streamed_matmul_kernel(
    *refs,
    block_columns: int,
    single_block: bool,
    transposed: bool,
    activation: str | None = None,
    eps: float | None = None,
):
    # refs as ``stream`` lays them out: x [M, K] (with an ``eps``, the norm's weight [1, K]);
    # the weights in HBM, [K, N] ([N, K] transposed): one, or gate and up with an
    # ``activation``; out [M, block_columns]; a buffer per weight, [2, K, block_columns]
    # ([2, block_columns, K] transposed); with an ``eps`` the normed x [M, K]; DMA semaphores.
    num_weights = 1 if activation is None else 2
    stream = StreamRefs.split(refs, num_x=1, num_sources=num_weights, eps=eps)
    slot = stream.next_block(
        block_columns=block_columns, transposed=transposed, single_block=single_block
    )
    contract = ((1,), (1,)) if transposed else ((1,), (0,))
    products = [
        jax.lax.dot_general(
            stream.x[0][...], buffer[slot], (contract, ((), ())), preferred_element_type=jnp.float32
        )
        for buffer in stream.buffers
    ]
    stream.write(products, activation)


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
    """``act(x @ gate) * (x @ up)`` (``elementwise.gated``) with both weights streamed from HBM
    side by side; ``activation``: a name in ``GATED_ACTIVATIONS``; ``norm`` as for
    :func:`streamed_matmul_tpu`."""
    check_activation(activation)
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(
            f"gate and up must share a shape and dtype, got {gate.shape} {gate.dtype} and "
            f"{up.shape} {up.dtype}"
        )
    return _streamed_call(
        x, (gate, up), transposed=False, activation=activation, norm=norm, interpret=interpret
    )


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
    plan = streamed_matmul_plan(
        rows, depth, columns, itemsize, num_weights=len(weights), normed=norm is not None
    )
    if plan is None:
        raise ValueError(
            f"x {x.shape} @ w {w.shape} does not fit the streamed matmul's VMEM budget "
            "(see streamed_matmul_plan); use jnp.dot"
        )
    width = plan.block_columns
    kernel = functools.partial(
        streamed_matmul_kernel,
        block_columns=width,
        single_block=width == columns,
        transposed=transposed,
        activation=activation,
        eps=None if norm is None else norm[1],
    )
    return stream_call(
        kernel,
        [x],
        [] if norm is None else [norm[0].reshape(1, depth)],
        list(weights),
        [(width, depth) if transposed else (depth, width)] * len(weights),
        columns=columns,
        block_columns=width,
        num_weights=len(weights),
        activation=activation,
        vmem_limit_bytes=max(plan.vmem_bytes + 4 * 2**20, 16 * 2**20),
        interpret=interpret,
        name="streamed_matmul_kernel" if activation is None else "streamed_gated_matmul",
    )
