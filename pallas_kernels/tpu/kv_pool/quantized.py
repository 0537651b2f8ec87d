"""The TPU KV pool in 8 bits: int8 or fp8 (e4m3) codes in the interleaved layout of
``kv_pool.layout`` plus bfloat16 scales, quantised when written and dequantised in VMEM by the
attention kernel.

  codes:  [P, S, 2 * Hkv_p, Dp]  int8 / float8_e4m3fn (K and V heads interleaved, as the float pool)
  scales: [P, 2 * Hkv_p * G, S]  bfloat16, lane-major: token t's scale of row r for lanes
                                 g * D/G .. (g+1) * D/G - 1 at [page, r * G + g, t] (G = 1, or
                                 D / 128 for heads wider than 128: ``kv_codes.SCALE_GROUP``)

One scale per token and KV row (per 128 lanes of a wider head), as the paired-pool backends'
``QuantizedPages`` (the measured choice: see ``jaxgen.quantization.kv_cache``), so both quantise
identically. Tokens sit on the lanes: a page's scales are ``2 * Hkv_p * G`` rows of
``page_size`` lanes, one bfloat16 per ``D / G`` code bytes (1.6% of the codes at D = 128). XLA
stores them unpadded in HBM (checked on compiled layouts for 4, 8 and 16 rows); in VMEM a
bfloat16 tile is 16 rows. page_size must be a multiple of 128: Mosaic DMAs and slices lanes in whole 128-lane
tiles, and a narrower page would be padded to 128 lanes in HBM (XLA also relaid out, i.e.
copied, a 32-lane scale pool before the update kernel). The attention kernel applies them to
score columns (K) and to probabilities (V) rather than dequantising codes, so no transpose is
needed. A token-major layout ``[P, S, 2 * Hkv_p * G]`` would pad its last axis to 128 lanes:
with 2 KV heads per chip that is 256 bytes of scales per token and layer, half as many as the
codes.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from pallas_kernels.kv_codes import SCALE_DTYPE, SCALE_GROUP
from pallas_kernels.tpu.kv_pool.layout import interleave_kv, padded_head_dim, padded_num_kv_heads
from pallas_kernels.tpu.tiling import LANES

SCALE_TILE_ROWS = 16  # sublanes of a bfloat16 tile (two values per 32-bit word)
CODE_DTYPES = {"int8": (jnp.dtype(jnp.int8), 127.0), "fp8": (jnp.dtype(jnp.float8_e4m3fn), 448.0)}


def scale_groups(head_dim: int) -> int:
    """Scales per token and KV row: one per ``SCALE_GROUP`` lanes of the real head_dim (or one
    per row when head_dim is no multiple of it)."""
    return head_dim // SCALE_GROUP if head_dim % SCALE_GROUP == 0 else 1


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=["codes", "scales"], meta_fields=[]
)
@dataclasses.dataclass(frozen=True)
class QuantizedKVPool:
    """One layer's 8-bit pool: ``codes`` [P, S, C, Dp] and ``scales`` [P, C * G, S] bfloat16
    (``scale_rows``). The real head_dim, which the groups split, comes with the queries."""

    codes: jax.Array
    scales: jax.Array

    @property
    def shape(self):
        return self.codes.shape

    def dequantize(self, head_dim: int) -> jax.Array:  # [P, S, C, Dp] float32
        """The float pool these codes stand for (for references and tests)."""
        num_pages, page_size, rows, lanes = self.codes.shape
        groups = scale_groups(head_dim)
        scales = self.scales.astype(jnp.float32).transpose(0, 2, 1)
        scales = scales.reshape(num_pages, page_size, rows, groups)
        group = jnp.minimum(jnp.arange(lanes) // (head_dim // groups), groups - 1)
        return self.codes.astype(jnp.float32) * scales[..., group]


def scale_rows(num_rows: int, head_dim: int) -> int:
    """Rows of a page's scales: ``num_rows * G``."""
    return num_rows * scale_groups(head_dim)


def scale_bytes_per_page(num_rows: int, head_dim: int, page_size: int) -> int:
    """HBM bytes of one page's scales as XLA stores them: ``scale_rows`` rows of 128-lane tiles,
    unpadded (a DMA of a page reads these)."""
    return scale_rows(num_rows, head_dim) * -(-page_size // LANES) * LANES * SCALE_DTYPE.itemsize


def scale_vmem_bytes_per_page(num_rows: int, head_dim: int, page_size: int) -> int:
    """VMEM bytes of one page's scales: rows padded to bfloat16's 16-row tiles."""
    rows = -(-scale_rows(num_rows, head_dim) // SCALE_TILE_ROWS) * SCALE_TILE_ROWS
    return rows * -(-page_size // LANES) * LANES * SCALE_DTYPE.itemsize


def quantized_pool_shapes(
    kv_cache_dtype: str, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int
) -> QuantizedKVPool:
    """The ``ShapeDtypeStruct`` pytree of one layer's 8-bit pool."""
    if kv_cache_dtype not in CODE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be 'int8' or 'fp8', got {kv_cache_dtype!r}")
    if page_size % LANES:
        raise ValueError(
            f"page_size={page_size}: an 8-bit TPU pool needs a multiple of {LANES} (its scales "
            "put a page's tokens on 128 lanes)"
        )
    code_dtype, _ = CODE_DTYPES[kv_cache_dtype]
    rows = 2 * padded_num_kv_heads(num_kv_heads, code_dtype)
    shape = (num_pages, page_size, rows, padded_head_dim(head_dim))
    return QuantizedKVPool(
        jax.ShapeDtypeStruct(shape, code_dtype),
        jax.ShapeDtypeStruct((num_pages, scale_rows(rows, head_dim), page_size), SCALE_DTYPE),
    )


def zeros_quantized_pool(shapes: QuantizedKVPool) -> QuantizedKVPool:
    return QuantizedKVPool(
        jnp.zeros(shapes.codes.shape, shapes.codes.dtype),
        jnp.ones(shapes.scales.shape, SCALE_DTYPE),
    )


def quantize_kv_rows(
    pool: QuantizedKVPool,
    new_k: jax.Array,  # [T, Hkv, D]
    new_v: jax.Array,  # [T, Hkv, D]
) -> tuple[jax.Array, jax.Array]:  # [T, C, Dp] codes, [T, C * G] bfloat16 scales
    """The new K/V rows as ``pool`` stores them: interleaved (``interleave_kv``), each row's
    scale groups (``scale_groups``) quantised over their own absmax into the pool's code dtype;
    padding rows and lanes are zero codes."""
    _, _, num_rows, head_dim_padded = pool.codes.shape
    code_dtype = pool.codes.dtype
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
    # Group maxima by masks over whole rows, not a [.., G, 32] reshape: XLA lays 32-wide minor
    # axes out padded to 128 lanes, which made this step count ~3x its bytes.
    lane_group = jnp.arange(head_dim) // (head_dim // groups)  # [D]
    magnitude = jnp.abs(rows)
    scales = (
        jnp.stack(
            [jnp.max(jnp.where(lane_group == g, magnitude, 0.0), axis=-1) for g in range(groups)],
            axis=-1,
        )
        / limit
    )  # [T, C, G]
    # Rounded to bfloat16 first, then used: the codes are taken over the stored scale.
    scales = jnp.where(scales == 0, 1.0, scales).astype(SCALE_DTYPE).astype(jnp.float32)
    lane_scales = scales[..., :1]
    for g in range(1, groups):
        lane_scales = jnp.where(lane_group == g, scales[..., g : g + 1], lane_scales)  # [T, C, D]
    codes = jnp.clip(rows / lane_scales, -limit, limit)  # a scale rounded down: <= 0.4% past
    if jnp.dtype(code_dtype) == jnp.int8:
        codes = jnp.round(codes)
    codes = jnp.pad(codes, ((0, 0), (0, 0), (0, head_dim_padded - head_dim))).astype(code_dtype)
    return codes, scales.reshape(num_tokens, num_rows * groups).astype(SCALE_DTYPE)
