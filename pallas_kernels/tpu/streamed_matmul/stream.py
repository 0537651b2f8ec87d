"""What the float and quantised streamed matmuls share: weights left in HBM and copied one column
block at a time into two-slot VMEM buffers, the next block's DMAs started before this block's
product; x's rows normed in VMEM once, while the first blocks are in flight; and the
``pallas_call`` around a kernel built on them.

A kernel's refs, in order: x's pieces ([M, K], or the two halves of an int4 call's rows), with
a norm the norm weight's pieces ([1, K_i] each); the sources in HBM (each weight's arrays);
the output [M, block_columns]; a two-slot buffer per source; with a norm the normed x pieces;
and DMA semaphores, two per source (one per slot).
"""

from __future__ import annotations

import dataclasses

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.tpu.streamed_matmul.elementwise import gated, rms_normed
from pallas_kernels.tpu.tiling import LANES


@dataclasses.dataclass(frozen=True)
class StreamRefs:
    """A kernel's refs by role (module docstring)."""

    x: tuple  # x's pieces, normed in VMEM when the call has a norm
    sources: tuple  # the weights' arrays in HBM
    out: object
    buffers: tuple  # [2, ...] per source
    semaphores: object
    prologue: object  # the norm, run once at the first grid step; None without one

    @classmethod
    def split(cls, refs, *, num_x: int, num_sources: int, eps: float | None) -> StreamRefs:
        x, refs = refs[:num_x], refs[num_x:]
        norm = ()
        if eps is not None:
            norm, refs = refs[:num_x], refs[num_x:]
        sources, out, refs = refs[:num_sources], refs[num_sources], refs[num_sources + 1 :]
        buffers, normed, semaphores = refs[:num_sources], refs[num_sources:-1], refs[-1]
        if eps is None:
            return cls(tuple(x), tuple(sources), out, tuple(buffers), semaphores, None)

        def prologue(raw=x):  # x's rows normed into ``normed``; every block reads those
            depth = sum(piece.shape[1] for piece in raw)
            pieces = rms_normed([p[...] for p in raw], [w[...] for w in norm], eps, depth)
            for ref, piece in zip(normed, pieces, strict=True):
                ref[...] = piece

        return cls(tuple(normed), tuple(sources), out, tuple(buffers), semaphores, prologue)

    def copies(self, index, slot, *, block_columns: int, transposed=False, single_block=False):
        """The DMAs of column block ``index`` of every source ([K', N], or [N, K'] when
        ``transposed``) into ``slot`` of its buffer; ``single_block``: one block as wide as the
        weight, of any width (else blocks of a multiple of 128 columns)."""
        start = 0 if single_block else pl.multiple_of(index * block_columns, LANES)
        columns = pl.ds(start, block_columns)
        return [
            pltpu.make_async_copy(
                source.at[columns, :] if transposed else source.at[:, columns],
                buffer.at[slot],
                self.semaphores.at[2 * i + slot],
            )
            for i, (source, buffer) in enumerate(zip(self.sources, self.buffers, strict=True))
        ]

    def next_block(self, **copy_options) -> jax.Array:
        """This grid step's slot, its block waited for: the first step starts block 0's DMAs
        and runs the prologue while they fly; every step starts the next block's DMAs into
        the other slot once its own block is in."""
        block, num_blocks = pl.program_id(0), pl.num_programs(0)

        @pl.when(block == 0)
        def _():
            for copy in self.copies(0, 0, **copy_options):
                copy.start()

        if self.prologue is not None:  # every block reads the normed rows
            pl.when(block == 0)(self.prologue)

        slot = block % 2
        for copy in self.copies(block, slot, **copy_options):
            copy.wait()

        @pl.when(block + 1 < num_blocks)
        def _():
            for copy in self.copies(block + 1, 1 - slot, **copy_options):
                copy.start()

        return slot

    def write(self, products: list, activation: str | None) -> None:
        """The block's output: the one product, or ``act(gate) * up`` of two."""
        if activation is None:
            self.out[...] = products[0].astype(self.out.dtype)
        else:
            self.out[...] = gated(*products, activation, self.out.dtype)


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


def stream_call(
    kernel,
    x_pieces: list,  # x [M, K], or its pieces
    norm_pieces: list,  # the norm weight's pieces [1, K_i] (empty without a norm)
    sources: list,  # the weights' arrays, streamed from HBM
    buffer_blocks: list,  # each source's block shape in VMEM
    *,
    columns: int,
    block_columns: int,
    num_weights: int,
    activation: str | None,
    vmem_limit_bytes: int,
    interpret,
    name: str,
):  # [M, columns], x's dtype
    """The ``pallas_call`` of a streamed kernel over ``columns // block_columns`` blocks, with
    its cost: each source and x once, the output once, plus the norm and the activation."""
    rows, depth = x_pieces[0].shape[0], sum(piece.shape[1] for piece in x_pieces)
    dtype, normed = x_pieces[0].dtype, bool(norm_pieces)
    source_bytes = sum(source.size * source.dtype.itemsize for source in sources)
    cost = pl.CostEstimate(
        flops=2 * num_weights * rows * depth * columns + normed * 4 * rows * depth,
        transcendentals=(0 if activation is None else rows * columns) + normed * rows,
        bytes_accessed=source_bytes
        + (rows * depth + rows * columns + normed * depth) * dtype.itemsize,
    )
    pinned = (s if interpret else pltpu.with_memory_space_constraint(s, pltpu.HBM) for s in sources)
    return pl.pallas_call(
        kernel,
        grid=(columns // block_columns,),
        in_specs=[pl.BlockSpec(a.shape, lambda block: (0, 0)) for a in x_pieces + norm_pieces]
        + [pl.BlockSpec(memory_space=pltpu.HBM)] * len(sources),
        out_specs=pl.BlockSpec((rows, block_columns), lambda block: (0, block)),
        out_shape=jax.ShapeDtypeStruct((rows, columns), dtype),
        scratch_shapes=[
            pltpu.VMEM((2, *block), source.dtype)
            for source, block in zip(sources, buffer_blocks, strict=True)
        ]
        + [pltpu.VMEM(piece.shape, piece.dtype) for piece in x_pieces] * normed
        + [pltpu.SemaphoreType.DMA((2 * len(sources),))],
        # Sequential: each grid step waits on the DMA the previous one started.
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("arbitrary",), vmem_limit_bytes=vmem_limit_bytes
        ),
        cost_estimate=cost,
        interpret=interpret,
        name=name,
    )(*x_pieces, *norm_pieces, *pinned)
