"""A Pallas TPU kernel that quantises a step's new K/V rows and writes codes and scales into an
8-bit pool (``QuantizedKVPool``) in place.

Codes: one DMA per token, HBM to HBM, all in flight at once (``kernel.row_copies``, as
``update_kv_cache_tpu``).
Scales: a token's scales are one lane column ``[C * G, 1]`` of its page's ``[C * G, S]`` scale
tile, and Mosaic DMAs whole 128-lane words only. So each page's tile is read into VMEM, its
tokens' columns are set there, and the tile is written back: tokens are walked in order, a page is
read when a token's page differs from the previous token's, and the previous page is written back
then (in flight while the next page is read, in the other of two VMEM buffers). A buffer's earlier
write is waited for before it is reused, so a page written twice in one call (not consecutively)
is read after its first write lands. In an engine step a page's tokens are consecutive (one
sequence writes it), so each touched page is read and written once.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.tpu.kv_cache_update.kernel import (
    check_update_args,
    page_and_offset,
    row_copies,
)
from pallas_kernels.tpu.kv_pool.layout import padded_head_dim
from pallas_kernels.tpu.kv_pool.quantized import (
    QuantizedKVPool,
    quantize_kv_rows,
    scale_bytes_per_page,
    scale_rows,
)


def _update_kernel(
    slots_ref,  # [T] SMEM: slot = page * page_size + offset
    codes_hbm,  # [T, C, Dp] HBM
    scales_ref,  # [T, C * G] VMEM, the new rows' scales (their bfloat16 values in float32)
    pool_codes_in,  # [P, S, C, Dp] HBM, aliased with pool_codes_out
    pool_scales_in,  # [P, C * G, S] HBM, aliased with pool_scales_out
    pool_codes_out,
    pool_scales_out,
    tiles,  # [2, C * G, S] VMEM bfloat16: scale tiles of the page being written and the last
    code_sems,  # DMA [1]
    read_sems,  # DMA [2]
    write_sems,  # DMA [2]
):
    del pool_codes_in, pool_scales_in  # same buffers as the outputs
    num_tokens = codes_hbm.shape[0]
    num_pages, page_size = pool_codes_out.shape[:2]
    num_scale_rows = tiles.shape[1]

    start_codes, wait_codes = row_copies(slots_ref, codes_hbm, pool_codes_out, code_sems.at[0])

    def slot_of(token):
        return page_and_offset(slots_ref, token, num_pages, page_size)

    def read(buffer, page):
        return pltpu.make_async_copy(
            pool_scales_out.at[page], tiles.at[buffer], read_sems.at[buffer]
        )

    def write(buffer, page):
        return pltpu.make_async_copy(
            tiles.at[buffer], pool_scales_out.at[page], write_sems.at[buffer]
        )

    diagonal = lax.broadcasted_iota(jnp.int32, (num_scale_rows, num_scale_rows), 0) == (
        lax.broadcasted_iota(jnp.int32, (num_scale_rows, num_scale_rows), 1)
    )
    lane = lax.broadcasted_iota(jnp.int32, (1, page_size), 1)

    def set_scales(token, carry):
        page_now, buffer, pending_0, pending_1 = carry  # page_now -1: no tile held yet
        in_range, page, offset = slot_of(token)
        switch = in_range & (page != page_now)
        other = 1 - buffer
        other_pending = jnp.where(other == 0, pending_0, pending_1)

        @pl.when(switch)
        def _():
            @pl.when(page_now >= 0)
            def _():
                write(buffer, page_now).start()

            @pl.when(other_pending == 1)
            def _():
                write(other, 0).wait()

            copy = read(other, page)
            copy.start()
            copy.wait()

        @pl.when(in_range)
        def _():
            target = jnp.where(switch, other, buffer)
            row = scales_ref[pl.ds(token, 1), :]  # [1, C * G]
            column = jnp.sum(
                jnp.where(diagonal, jnp.broadcast_to(row, diagonal.shape), 0.0),
                axis=1,
                keepdims=True,
            )  # [C * G, 1]: the row turned into a column, exactly
            # Selected in float32 (exact both ways): Mosaic has no bfloat16-layout booleans.
            tile = tiles[target].astype(jnp.float32)
            tiles[target] = jnp.where(lane == offset, column, tile).astype(tiles.dtype)

        written = switch & (page_now >= 0)  # the held tile's write is in flight now
        pending_0 = jnp.where(switch & (buffer == 0), written.astype(jnp.int32), pending_0)
        pending_1 = jnp.where(switch & (buffer == 1), written.astype(jnp.int32), pending_1)
        pending_0 = jnp.where(switch & (other == 0), 0, pending_0)
        pending_1 = jnp.where(switch & (other == 1), 0, pending_1)
        return (
            jnp.where(switch, page, page_now),
            jnp.where(switch, other, buffer),
            pending_0,
            pending_1,
        )

    start_codes()
    start = (jnp.int32(-1), jnp.int32(0), jnp.int32(0), jnp.int32(0))
    page_now, buffer, pending_0, pending_1 = lax.fori_loop(0, num_tokens, set_scales, start)
    other_pending = jnp.where(buffer == 0, pending_1, pending_0)

    @pl.when(other_pending == 1)
    def _():
        write(1 - buffer, 0).wait()

    @pl.when(page_now >= 0)
    def _():
        copy = write(buffer, page_now)
        copy.start()
        copy.wait()

    wait_codes()


@functools.partial(jax.jit, static_argnames=("interpret",))
def _update(pool, new_k, new_v, slot_mapping, *, interpret):
    num_pages, page_size, num_rows, head_dim_padded = pool.codes.shape
    codes, scales = quantize_kv_rows(pool, new_k, new_v)  # [T, C, Dp], [T, C * G] bfloat16
    scales = scales.astype(jnp.float32)  # the kernel turns rows into columns in float32
    num_tokens, num_scale_rows = scales.shape
    tile_bytes = scale_bytes_per_page(num_rows, new_k.shape[-1], page_size)
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    new_codes, new_scales = pl.pallas_call(
        _update_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(1,),
            in_specs=[
                any_spec,
                pl.BlockSpec((num_tokens, num_scale_rows), lambda i, *_: (0, 0)),
                any_spec,
                any_spec,
            ],
            out_specs=[any_spec, any_spec],
            scratch_shapes=[
                pltpu.VMEM((2, num_scale_rows, page_size), pool.scales.dtype),
                pltpu.SemaphoreType.DMA((1,)),
                pltpu.SemaphoreType.DMA((2,)),
                pltpu.SemaphoreType.DMA((2,)),
            ],
        ),
        out_shape=[
            jax.ShapeDtypeStruct(pool.codes.shape, pool.codes.dtype),
            jax.ShapeDtypeStruct(pool.scales.shape, pool.scales.dtype),
        ],
        input_output_aliases={3: 0, 4: 1},  # (slots, codes, scales, pool codes, pool scales)
        cost_estimate=pl.CostEstimate(
            flops=0,
            transcendentals=0,
            # Codes in and out, the new scales, and at most one scale tile read and written
            # per token.
            bytes_accessed=2 * codes.size * codes.dtype.itemsize
            + scales.size * 4
            + 2 * min(num_tokens, num_pages) * tile_bytes
            + 4 * num_tokens,
        ),
        interpret=interpret,
        name="kv_cache_update_quantized",
    )(
        slot_mapping,
        codes,
        scales,
        pool.codes,
        pool.scales,
    )
    return QuantizedKVPool(new_codes, new_scales)


def update_quantized_pool_tpu(
    pool: QuantizedKVPool,
    new_k: jax.Array,  # [T, Hkv, D]
    new_v: jax.Array,  # [T, Hkv, D]
    slot_mapping: jax.Array,  # [T] int32
    *,
    interpret=False,
) -> QuantizedKVPool:
    """Quantises token t's K/V rows and writes codes and scales into slot ``slot_mapping[t]``
    in place (both arrays aliased input -> output, as ``update_kv_cache_tpu``); slots outside
    ``[0, P * S)`` are skipped. A later token wins when two write the same slot."""
    if not isinstance(pool, QuantizedKVPool) or pool.codes.ndim != 4:
        raise ValueError(f"pool must be a QuantizedKVPool of rank-4 codes, got {pool!r:.80}")
    num_pages, page_size, num_rows, head_dim_padded = pool.codes.shape
    check_update_args(pool.codes.shape, new_k, new_v, slot_mapping, pool_name="the pool's")
    head_dim = new_k.shape[-1]
    if padded_head_dim(head_dim) != head_dim_padded:
        raise ValueError(
            f"new_k head_dim {head_dim} must pad to the pool's {head_dim_padded} lanes, got "
            f"{padded_head_dim(head_dim)}"
        )
    expected = (num_pages, scale_rows(num_rows, head_dim), page_size)
    if pool.scales.shape != expected:
        raise ValueError(f"pool.scales must be [P, C * G, S] = {expected}, got {pool.scales.shape}")
    return _update(pool, new_k, new_v, slot_mapping, interpret=interpret)
