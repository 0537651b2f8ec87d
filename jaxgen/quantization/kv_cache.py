"""The KV pool in 8 bits: int8 or fp8 (e4m3) values with one bfloat16 scale per token and KV
head (``kv_codes.SCALE_GROUP``: heads wider than 128 have one per 128 elements), quantised when
a layer writes its new keys and values, dequantised only where attention reads them (the pages
it gathers).

Per token (rather than per page and head): a page's scale would have to be known before its last
token is written, or its earlier tokens requantised; a token's own scales are fixed when it is
written, so a write stays one scatter. Per head rather than per 32 elements: over the accuracy
set of docs/benchmarks.md, "Quantised weights and KV pools" (32 prompts x 64 tokens, default
model), teacher-forced top-1 agreement with the float pool is 98.8% (int8) and 96.1-96.4% (fp8)
with one scale per head, against 99.0% and 96.5-97.5% with two (the bars are 98% and 95%); a few
large channels set the step of all 64 of SmolLM2's key elements, which costs those fractions of
a point, and the pool shrinks by 3% (an 8-bit TPU pool's scales by a quarter). The scales are
bfloat16 (float32's exponent range, 8 significant bits): each is rounded before the codes are
divided by it, so the codes and scales stand for the values as exactly as float32 scales would,
up to a step 0.4% coarser at most. Cost: 66 bytes per token and head at head_dim 64 against 256
in float32 (0.258x; 68 with two scales per head, 72 with float32 scales).

fp8 codes are stored as their bits in a uint8 array, and the bfloat16 scales as theirs in a
uint16 array; both are read back as what they are where attention gathers them. XLA:CPU writes
into a uint8 or uint16 array in place but copies a float8 or bfloat16 array whole, which made
every step cost time in proportion to the pool (a 256 MB pool: 392 ms a write as float8, 0.4 ms
as uint8; a 38 MB scale pool: 62 ms as bfloat16, 0.02 ms as uint16).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from pallas_kernels.kv_codes import SCALE_DTYPE, SCALE_GROUP, codes_to_float, scales_to_float

KV_CACHE_DTYPES = ("auto", "int8", "fp8")
# kind: (stored dtype, dtype of the codes, largest code)
_STORAGE = {"int8": (jnp.int8, jnp.int8, 127.0), "fp8": (jnp.uint8, jnp.float8_e4m3fn, 448.0)}


def validate_kv_cache_dtype(value) -> str:
    if value not in KV_CACHE_DTYPES:
        raise ValueError(
            f"kv_cache_dtype must be one of {', '.join(map(repr, KV_CACHE_DTYPES))}, got {value!r}"
        )
    return value


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=["values", "scales"], meta_fields=[]
)
@dataclasses.dataclass(frozen=True)
class QuantizedPages:
    """One of a layer's K or V pools: ``values`` [Hkv, P, S, D] int8 codes, or uint8 holding
    float8_e4m3fn codes' bits, and their bfloat16 ``scales`` as uint16 bits."""

    values: jax.Array  # [Hkv, P, S, D] int8, or uint8 (fp8 bits)
    scales: jax.Array  # [Hkv, P, S, G] uint16 (bfloat16 bits): G = head_dim / SCALE_GROUP

    @property
    def shape(self):
        return self.values.shape

    def gather(self, block_tables: jax.Array, dtype=jnp.float32) -> jax.Array:
        """Pages by id, dequantised: [Hkv, ..., W, S, D] (as ``gather_pages`` of a float pool)."""
        values = self.values.at[:, block_tables].get(mode="promise_in_bounds")
        scales = self.scales.at[:, block_tables].get(mode="promise_in_bounds")
        groups = scales.shape[-1]
        grouped = codes_to_float(values.reshape(*values.shape[:-1], groups, -1))
        grouped = grouped * scales_to_float(scales)[..., None]
        return grouped.reshape(values.shape).astype(dtype)


def _groups(head_dim: int) -> int:
    return head_dim // SCALE_GROUP if head_dim % SCALE_GROUP == 0 else 1


def pool_shapes(kv_cache_dtype: str, shape: tuple, dtype) -> object:
    """The ``ShapeDtypeStruct`` pytree of one K or V pool of ``shape`` [Hkv, P, S, D]."""
    if kv_cache_dtype == "auto":
        return jax.ShapeDtypeStruct(shape, dtype)
    storage, _, _ = _STORAGE[kv_cache_dtype]
    return QuantizedPages(
        jax.ShapeDtypeStruct(shape, storage),
        jax.ShapeDtypeStruct((*shape[:-1], _groups(shape[-1])), jnp.uint16),
    )


def zeros(kv_cache_dtype: str, shape: tuple, dtype) -> object:
    if kv_cache_dtype == "auto":
        return jnp.zeros(shape, dtype)
    storage, _, _ = _STORAGE[kv_cache_dtype]
    scales = _bits(jnp.ones((*shape[:-1], _groups(shape[-1])), SCALE_DTYPE))
    return QuantizedPages(jnp.zeros(shape, storage), scales)


def write(pages, new: jax.Array, slot_mapping: jax.Array):
    """``pages`` with ``new`` ([T, Hkv, D]) written at ``slot_mapping`` ([T]); a quantised pool
    takes each token's values over its own absmax scale."""
    if not isinstance(pages, QuantizedPages):
        hkv, num_pages, page_size, dim = pages.shape
        flat = pages.reshape(hkv, num_pages * page_size, dim)
        flat = flat.at[:, slot_mapping].set(new.swapaxes(0, 1).astype(pages.dtype))
        return flat.reshape(pages.shape)
    hkv, num_pages, page_size, dim = pages.values.shape
    storage, code_dtype, limit = _STORAGE["int8" if pages.values.dtype == jnp.int8 else "fp8"]
    groups = pages.scales.shape[-1]
    new = new.astype(jnp.float32).swapaxes(0, 1)  # [Hkv, T, D]
    grouped = new.reshape(*new.shape[:-1], groups, dim // groups)  # [Hkv, T, G, D / G]
    scales = jnp.max(jnp.abs(grouped), axis=-1) / limit  # [Hkv, T, G]
    scales = jnp.where(scales == 0, 1.0, scales).astype(SCALE_DTYPE)  # rounded, then used
    codes = (grouped / scales.astype(jnp.float32)[..., None]).reshape(new.shape)
    codes = jnp.clip(codes, -limit, limit)  # a scale rounded down: at most 0.4% past the limit
    codes = jnp.round(codes) if code_dtype == jnp.int8 else codes
    codes = jax.lax.bitcast_convert_type(codes.astype(code_dtype), storage)
    values = pages.values.reshape(hkv, num_pages * page_size, dim)
    values = values.at[:, slot_mapping].set(codes)
    scale_pool = pages.scales.reshape(hkv, num_pages * page_size, groups)
    scale_pool = scale_pool.at[:, slot_mapping].set(_bits(scales))
    return QuantizedPages(
        values.reshape(pages.values.shape), scale_pool.reshape(pages.scales.shape)
    )


def _bits(scales: jax.Array) -> jax.Array:
    return jax.lax.bitcast_convert_type(scales.astype(SCALE_DTYPE), jnp.uint16)


def bytes_per_token(config) -> int:
    """Bytes an 8-bit pool takes per token over every layer, K and V: codes plus scales."""
    per_head = config.head_dim + jnp.dtype(SCALE_DTYPE).itemsize * _groups(config.head_dim)
    return 2 * config.num_layers * config.num_kv_heads * per_head
