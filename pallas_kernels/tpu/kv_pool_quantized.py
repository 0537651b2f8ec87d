"""The TPU KV pool in 8 bits: int8 or fp8 (e4m3) codes in the interleaved layout of
``kv_cache_update`` plus float32 scales, quantised when written and dequantised in VMEM by the
attention kernel.

  codes:  [P, S, 2 * Hkv_p, Dp]  int8 / float8_e4m3fn (K and V heads interleaved, as the float pool)
  scales: [P, S, Ls]             float32, row r's scale for lanes g * D/G .. (g+1) * D/G - 1 at
                                 column r * G + g (G = D / 32 groups, or 1 when D is no multiple
                                 of 32: the engine's ``kv_cache.SCALE_GROUP``); Ls is 2 * Hkv_p * G
                                 rounded up to 128 lanes

One scale per token, KV row and 32 lanes, as the paired-pool backends' ``QuantizedPages``
(the measured choice: see ``jaxgen.quantization.kv_cache``). The scales sit beside their page's
codes so one DMA per page brings them with it. Their last axis is padded to whole 128-lane tiles
in the array itself: HBM would pad it anyway, and a narrower array made XLA relayout (copy) the
whole scale pool before the kernel (e.g. 64 -> 128 columns for 8 KV heads at D = 128: 512 bytes
of scales per token and layer beside 2048 of codes).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.tpu.kv_cache_update import (
    LANES,
    interleave_kv,
    padded_head_dim,
    padded_num_kv_heads,
)

SCALE_GROUP = 32
CODE_DTYPES = {"int8": (jnp.dtype(jnp.int8), 127.0), "fp8": (jnp.dtype(jnp.float8_e4m3fn), 448.0)}


def scale_groups(head_dim: int) -> int:
    """Scales per token and KV row: one per 32 lanes of the real head_dim (or one per row)."""
    return head_dim // SCALE_GROUP if head_dim % SCALE_GROUP == 0 else 1


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=["codes", "scales"], meta_fields=[]
)
@dataclasses.dataclass(frozen=True)
class QuantizedKVPool:
    """One layer's 8-bit pool: ``codes`` [P, S, C, Dp] and ``scales`` [P, S, Ls] float32
    (``scale_columns``). The real head_dim, which the groups split, comes with the queries."""

    codes: jax.Array
    scales: jax.Array

    @property
    def shape(self):
        return self.codes.shape

    def dequantize(self, head_dim: int) -> jax.Array:  # [P, S, C, Dp] float32
        """The float pool these codes stand for (for references and tests)."""
        *lead, rows, lanes = self.codes.shape
        groups = scale_groups(head_dim)
        scales = self.scales[..., : rows * groups].reshape(*lead, rows, groups)
        group = jnp.minimum(jnp.arange(lanes) // (head_dim // groups), groups - 1)
        return self.codes.astype(jnp.float32) * scales[..., group]


def scale_columns(num_rows: int, head_dim: int) -> int:
    """Columns of the scale array: ``num_rows * G`` rounded up to 128 lanes."""
    return -(-num_rows * scale_groups(head_dim) // LANES) * LANES


def quantized_pool_shapes(
    kv_cache_dtype: str, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int
) -> QuantizedKVPool:
    """The ``ShapeDtypeStruct`` pytree of one layer's 8-bit pool."""
    if kv_cache_dtype not in CODE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be 'int8' or 'fp8', got {kv_cache_dtype!r}")
    code_dtype, _ = CODE_DTYPES[kv_cache_dtype]
    rows = 2 * padded_num_kv_heads(num_kv_heads, code_dtype)
    shape = (num_pages, page_size, rows, padded_head_dim(head_dim))
    return QuantizedKVPool(
        jax.ShapeDtypeStruct(shape, code_dtype),
        jax.ShapeDtypeStruct((num_pages, page_size, scale_columns(rows, head_dim)), jnp.float32),
    )


def zeros_quantized_pool(shapes: QuantizedKVPool) -> QuantizedKVPool:
    return QuantizedKVPool(
        jnp.zeros(shapes.codes.shape, shapes.codes.dtype),
        jnp.ones(shapes.scales.shape, jnp.float32),
    )


def quantize_kv_rows(
    new_k: jax.Array,  # [T, Hkv, D]
    new_v: jax.Array,  # [T, Hkv, D]
    *,
    code_dtype,
    num_rows: int,
    head_dim_padded: int,
) -> tuple[jax.Array, jax.Array]:  # [T, C, Dp] codes, [T, C * G] float32 scales
    """Interleaves the new K/V rows (``interleave_kv``) and quantises each row's 32-lane groups
    over their own absmax; padding rows and lanes are zero codes."""
    head_dim = new_k.shape[-1]
    groups = scale_groups(head_dim)
    limit = CODE_DTYPES["int8" if jnp.dtype(code_dtype) == jnp.int8 else "fp8"][1]
    rows = interleave_kv(
        new_k.astype(jnp.float32),
        new_v.astype(jnp.float32),
        num_rows=num_rows,
        head_dim_padded=head_dim,
    )  # [T, C, D]: lanes padded after quantising
    num_tokens = rows.shape[0]
    grouped = rows.reshape(num_tokens, num_rows, groups, head_dim // groups)
    scales = jnp.max(jnp.abs(grouped), axis=-1) / limit  # [T, C, G]
    scales = jnp.where(scales == 0, 1.0, scales)
    codes = (grouped / scales[..., None]).reshape(rows.shape)
    if jnp.dtype(code_dtype) == jnp.int8:
        codes = jnp.round(codes)
    codes = jnp.pad(codes, ((0, 0), (0, 0), (0, head_dim_padded - head_dim))).astype(code_dtype)
    scales = scales.reshape(num_tokens, num_rows * groups)
    columns = scale_columns(num_rows, head_dim)
    return codes, jnp.pad(scales, ((0, 0), (0, columns - num_rows * groups)), constant_values=1.0)


def update_quantized_pool_reference(
    pool: QuantizedKVPool,
    new_k: jax.Array,  # [T, Hkv, D]
    new_v: jax.Array,  # [T, Hkv, D]
    slot_mapping: jax.Array,  # [T] int32
) -> QuantizedKVPool:
    """Scatter of each token's quantised rows and scales into its slot (out-of-range dropped)."""
    num_pages, page_size, num_rows, head_dim_padded = pool.codes.shape
    codes, scales = quantize_kv_rows(
        new_k,
        new_v,
        code_dtype=pool.codes.dtype,
        num_rows=num_rows,
        head_dim_padded=head_dim_padded,
    )
    num_slots = num_pages * page_size
    slots = jnp.where((slot_mapping >= 0) & (slot_mapping < num_slots), slot_mapping, num_slots)
    flat_codes = pool.codes.reshape(num_slots, num_rows, head_dim_padded)
    flat_scales = pool.scales.reshape(num_slots, -1)
    return QuantizedKVPool(
        flat_codes.at[slots].set(codes, mode="drop").reshape(pool.codes.shape),
        flat_scales.at[slots].set(scales, mode="drop").reshape(pool.scales.shape),
    )


def _update_kernel(
    slots_ref,  # [T] SMEM: slot = page * page_size + offset
    codes_hbm,  # [T, C, Dp] HBM
    scales_hbm,  # [T, Ls] HBM
    pool_codes_in,  # [P, S, C, Dp] HBM, aliased with pool_codes_out
    pool_scales_in,  # [P, S, Ls] HBM, aliased with pool_scales_out
    pool_codes_out,
    pool_scales_out,
    sems,  # DMA [2]
):
    del pool_codes_in, pool_scales_in  # same buffers as the outputs
    num_tokens = codes_hbm.shape[0]
    num_pages, page_size = pool_codes_out.shape[:2]

    def copies(token):
        slot = slots_ref[token]
        in_range = (slot >= 0) & (slot < num_pages * page_size)
        slot = jnp.where(in_range, slot, 0)
        page, offset = slot // page_size, slot % page_size
        codes = pltpu.make_async_copy(
            codes_hbm.at[token], pool_codes_out.at[page, offset], sems.at[0]
        )
        scales = pltpu.make_async_copy(
            scales_hbm.at[pl.ds(token, 1)],
            pool_scales_out.at[page, pl.ds(offset, 1)],
            sems.at[1],
        )
        return in_range, (codes, scales)

    def start(token, carry):
        in_range, pair = copies(token)
        for copy in pair:
            pl.when(in_range)(copy.start)
        return carry

    def wait(token, carry):
        in_range, pair = copies(token)
        for copy in pair:
            pl.when(in_range)(copy.wait)
        return carry

    # All rows in flight at once, then drain: the DMA engine overlaps them.
    jax.lax.fori_loop(0, num_tokens, start, 0)
    jax.lax.fori_loop(0, num_tokens, wait, 0)


@functools.partial(jax.jit, static_argnames=("interpret",))
def _update(pool, new_k, new_v, slot_mapping, *, interpret):
    _, _, num_rows, head_dim_padded = pool.codes.shape
    codes, scales = quantize_kv_rows(
        new_k,
        new_v,
        code_dtype=pool.codes.dtype,
        num_rows=num_rows,
        head_dim_padded=head_dim_padded,
    )
    num_tokens = codes.shape[0]
    row_bytes = num_rows * head_dim_padded + 4 * scales.shape[1]
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    new_codes, new_scales = pl.pallas_call(
        _update_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(1,),
            in_specs=[any_spec] * 4,
            out_specs=[any_spec, any_spec],
            scratch_shapes=[pltpu.SemaphoreType.DMA((2,))],
        ),
        out_shape=[
            jax.ShapeDtypeStruct(pool.codes.shape, pool.codes.dtype),
            jax.ShapeDtypeStruct(pool.scales.shape, pool.scales.dtype),
        ],
        input_output_aliases={3: 0, 4: 1},  # (slots, codes, scales, pool codes, pool scales)
        cost_estimate=pl.CostEstimate(
            flops=0, transcendentals=0, bytes_accessed=2 * num_tokens * row_bytes + 4 * num_tokens
        ),
        interpret=interpret,
        name="kv_cache_update_quantized",
    )(slot_mapping, codes, scales, pool.codes, pool.scales)
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
    ``[0, P * S)`` are skipped."""
    if not isinstance(pool, QuantizedKVPool) or pool.codes.ndim != 4:
        raise ValueError(f"pool must be a QuantizedKVPool of rank-4 codes, got {pool!r:.80}")
    num_pages, page_size, num_rows, head_dim_padded = pool.codes.shape
    for name, x in (("new_k", new_k), ("new_v", new_v)):
        if x.ndim != 3 or x.shape != new_k.shape:
            raise ValueError(f"{name} must be [T, Hkv, D] like new_k, got shape {x.shape}")
    num_tokens, num_kv_heads, head_dim = new_k.shape
    if padded_head_dim(head_dim) != head_dim_padded or 2 * num_kv_heads > num_rows:
        raise ValueError(
            f"new_k heads/head_dim {new_k.shape[1:]} do not fit the pool's rows/lanes "
            f"{(num_rows, head_dim_padded)}"
        )
    expected = (num_pages, page_size, scale_columns(num_rows, head_dim))
    if pool.scales.shape != expected:
        raise ValueError(f"pool.scales must be [P, S, Ls] = {expected}, got {pool.scales.shape}")
    if slot_mapping.shape != (num_tokens,) or slot_mapping.dtype != jnp.int32:
        raise ValueError(
            f"slot_mapping must be int32 [{num_tokens}], got {slot_mapping.dtype} "
            f"{slot_mapping.shape}"
        )
    return _update(pool, new_k, new_v, slot_mapping, interpret=interpret)
