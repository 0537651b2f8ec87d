"""Paged decode attention for XLA:CPU as a native kernel (C++ through the XLA FFI).

The pure-JAX reference (``paged_attention_reference``) gathers every sequence's pages into a
temporary and transposes it for the batched dot; on a CPU those copies cost more than the
attention itself. This kernel reads keys and values page by page from the pool instead. It is
compiled from ``native/paged_attention_cpu.cc`` on first use (``build``); where that is not
possible, ``cpu_kernel_available()`` is False and callers keep the reference.

``paged_attention_cpu_quantized`` reads an 8-bit pool (``QuantizedPages``: int8 or fp8 codes with
bfloat16 scales per token, head and scale group) and dequantises each load in registers.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxgen.backends.cpu_kernels.build import load_library, register
from pallas_kernels.kv_codes import EIGHT_BIT_DTYPES
from pallas_kernels.validation import validate_common, validate_int_array

TARGET = "jaxgen_paged_decode_f32"
QUANTIZED_TARGET = "jaxgen_paged_decode_q8"


@functools.cache
def cpu_kernel_available() -> bool:
    """Builds and registers the kernel once; False when that is not possible."""
    library = load_library()
    if library is None:
        return False
    register(library, "JaxgenPagedDecodeF32", TARGET)
    register(library, "JaxgenPagedDecodeQ8", QUANTIZED_TARGET)
    return True


def paged_attention_cpu(
    q: jax.Array,  # [B, Hq, D] float32
    k_pages: jax.Array,  # [Hkv, P, S, D] float32
    v_pages: jax.Array,  # [Hkv, P, S, D] float32
    lengths: jax.Array,  # [B] int32
    block_tables: jax.Array,  # [B, W] int32
    *,
    scale: float | None = None,
    soft_cap: float | None = None,
    sliding_window: int | None = None,
) -> jax.Array:  # [B, Hq, D]
    """Paged decode attention on XLA:CPU; same contract as ``paged_attention_reference``."""
    batch, num_heads, head_dim = q.shape
    validate_common(
        q, k_pages, v_pages, scale=scale, soft_cap=soft_cap, sliding_window=sliding_window
    )
    validate_int_array("lengths", lengths, (batch,))
    validate_int_array("block_tables", block_tables, (batch, block_tables.shape[-1]))
    for name, array in (("q", q), ("k_pages", k_pages), ("v_pages", v_pages)):
        if array.dtype != jnp.float32:
            raise ValueError(f"{name} must be float32 for the CPU kernel, got {array.dtype}")
    if not cpu_kernel_available():
        raise RuntimeError("the CPU paged-attention kernel could not be built on this machine")
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(q.shape, q.dtype))
    return call(
        q,
        k_pages,
        v_pages,
        lengths,
        block_tables,
        scale=np.float32(head_dim**-0.5 if scale is None else scale),
        soft_cap=np.float32(soft_cap or 0.0),
        sliding_window=np.int64(sliding_window or 0),
    )


def paged_attention_cpu_quantized(
    q: jax.Array,  # [B, Hq, D] float32
    k_pages,  # QuantizedPages: values [Hkv, P, S, D] int8 / uint8 (fp8 bits), scales [Hkv, P, S, G]
    v_pages,  # QuantizedPages, as k_pages
    lengths: jax.Array,  # [B] int32
    block_tables: jax.Array,  # [B, W] int32
    *,
    scale: float | None = None,
    soft_cap: float | None = None,
    sliding_window: int | None = None,
) -> jax.Array:  # [B, Hq, D]
    """Paged decode attention over an 8-bit pool; equals ``paged_attention_reference`` on the
    dequantised pool (``QuantizedPages.gather``) up to float rounding."""
    batch, num_heads, head_dim = q.shape
    validate_common(
        q,
        k_pages.values,
        v_pages.values,
        scale=scale,
        soft_cap=soft_cap,
        sliding_window=sliding_window,
        pool_dtypes=EIGHT_BIT_DTYPES,
    )
    validate_int_array("lengths", lengths, (batch,))
    validate_int_array("block_tables", block_tables, (batch, block_tables.shape[-1]))
    if q.dtype != jnp.float32:
        raise ValueError(f"q must be float32 for the CPU kernel, got {q.dtype}")
    fp8 = k_pages.values.dtype == jnp.uint8
    groups = k_pages.scales.shape[-1]
    for name, pages in (("k_pages", k_pages), ("v_pages", v_pages)):
        if pages.scales.shape != (*pages.values.shape[:-1], groups) or (
            pages.scales.dtype != jnp.uint16
        ):
            raise ValueError(
                f"{name}.scales must be uint16 (bfloat16 bits) {(*pages.values.shape[:-1], groups)}, got "
                f"{pages.scales.dtype} {pages.scales.shape}"
            )
    if head_dim % groups or (groups > 1 and (head_dim // groups) % 8):
        raise ValueError(f"{groups} scale groups must split head_dim {head_dim} in multiples of 8")
    if not cpu_kernel_available():
        raise RuntimeError("the CPU paged-attention kernel could not be built on this machine")

    def raw(values):  # the codes as bytes (int8 codes: a bitcast, no copy)
        return jax.lax.bitcast_convert_type(values, jnp.uint8)

    call = jax.ffi.ffi_call(QUANTIZED_TARGET, jax.ShapeDtypeStruct(q.shape, q.dtype))
    return call(
        q,
        raw(k_pages.values),
        k_pages.scales,
        raw(v_pages.values),
        v_pages.scales,
        lengths,
        block_tables,
        scale=np.float32(head_dim**-0.5 if scale is None else scale),
        soft_cap=np.float32(soft_cap or 0.0),
        sliding_window=np.int64(sliding_window or 0),
        fp8=np.int64(fp8),
    )
