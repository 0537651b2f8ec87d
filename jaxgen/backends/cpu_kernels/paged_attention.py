"""Paged decode attention for XLA:CPU as a native kernel (C++ through the XLA FFI).

The pure-JAX reference (``paged_attention_reference``) gathers every sequence's pages into a
temporary and transposes it for the batched dot; on a CPU those copies cost more than the
attention itself. This kernel reads keys and values page by page from the pool instead. It is
compiled from ``native/paged_attention_cpu.cc`` on first use (``build``); where that is not
possible, ``cpu_kernel_available()`` is False and callers keep the reference.

Given an 8-bit pool (``QuantizedPages``: int8 or fp8 codes with bfloat16 scales per token, head
and scale group) the same entry point runs the 8-bit kernel, which dequantises each load in
registers.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxgen.backends.cpu_kernels.build import load_library, register
from jaxgen.quantization.kv_cache import QuantizedPages
from pallas_kernels.kv_codes import EIGHT_BIT_DTYPES
from pallas_kernels.validation import FLOAT_DTYPES, validate_common, validate_int_array

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
    k_pages,  # [Hkv, P, S, D] float32, or QuantizedPages (8-bit codes and their scales)
    v_pages,  # as k_pages
    lengths: jax.Array,  # [B] int32
    block_tables: jax.Array,  # [B, W] int32
    *,
    scale: float | None = None,
    soft_cap: float | None = None,
    sliding_window: int | None = None,
) -> jax.Array:  # [B, Hq, D]
    """Paged decode attention on XLA:CPU; same contract as ``paged_attention_reference``.

    ``k_pages`` and ``v_pages`` are a float32 pool, or an 8-bit one (``QuantizedPages``: values
    [Hkv, P, S, D] int8 / uint8 (fp8 bits), scales [Hkv, P, S, G]) whose loads the kernel
    dequantises in registers: it then equals the reference on the dequantised pool
    (``QuantizedPages.gather``) up to float rounding.
    """
    batch, num_heads, head_dim = q.shape
    quantized = isinstance(k_pages, QuantizedPages)
    validate_common(
        q,
        k_pages.values if quantized else k_pages,
        v_pages.values if quantized else v_pages,
        scale=scale,
        soft_cap=soft_cap,
        sliding_window=sliding_window,
        pool_dtypes=EIGHT_BIT_DTYPES if quantized else FLOAT_DTYPES,
    )
    validate_int_array("lengths", lengths, (batch,))
    validate_int_array("block_tables", block_tables, (batch, block_tables.shape[-1]))
    if quantized:
        target, pool = QUANTIZED_TARGET, _quantized_operands(q, k_pages, v_pages)
        options = {"fp8": np.int64(k_pages.values.dtype == jnp.uint8)}
    else:
        target, pool, options = TARGET, _float_operands(q, k_pages, v_pages), {}
    if not cpu_kernel_available():
        raise RuntimeError("the CPU paged-attention kernel could not be built on this machine")
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(q.shape, q.dtype))
    return call(
        q,
        *pool,
        lengths,
        block_tables,
        scale=np.float32(head_dim**-0.5 if scale is None else scale),
        soft_cap=np.float32(soft_cap or 0.0),
        sliding_window=np.int64(sliding_window or 0),
        **options,
    )


def _float_operands(q, k_pages, v_pages) -> tuple:
    """The float kernel's pool operands, after checking every array is float32."""
    for name, array in (("q", q), ("k_pages", k_pages), ("v_pages", v_pages)):
        if array.dtype != jnp.float32:
            raise ValueError(f"{name} must be float32 for the CPU kernel, got {array.dtype}")
    return k_pages, v_pages


def _quantized_operands(q, k_pages, v_pages) -> tuple:
    """The 8-bit kernel's pool operands (codes as bytes, then scales, per pool), after checking
    the scales' dtype and shape and that the scale groups split ``head_dim`` evenly."""
    head_dim = q.shape[-1]
    if q.dtype != jnp.float32:
        raise ValueError(f"q must be float32 for the CPU kernel, got {q.dtype}")
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

    def raw(values):  # the codes as bytes (int8 codes: a bitcast, no copy)
        return jax.lax.bitcast_convert_type(values, jnp.uint8)

    return raw(k_pages.values), k_pages.scales, raw(v_pages.values), v_pages.scales
