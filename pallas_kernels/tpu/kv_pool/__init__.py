"""The KV pool the TPU kernels share: K and V heads interleaved on one axis, float or 8-bit codes
with lane-major scales."""

from pallas_kernels.tpu.kv_pool.layout import (
    POOL_DTYPES,
    deinterleave_kv,
    interleave_kv,
    kv_pool_shape,
    padded_head_dim,
    padded_num_kv_heads,
)
from pallas_kernels.tpu.kv_pool.quantized import (
    QuantizedKVPool,
    quantize_kv_rows,
    quantized_pool_shapes,
    zeros_quantized_pool,
)

__all__ = [
    "POOL_DTYPES",
    "QuantizedKVPool",
    "deinterleave_kv",
    "interleave_kv",
    "kv_pool_shape",
    "padded_head_dim",
    "padded_num_kv_heads",
    "quantize_kv_rows",
    "quantized_pool_shapes",
    "zeros_quantized_pool",
]
