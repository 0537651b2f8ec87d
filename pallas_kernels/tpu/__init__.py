"""Mosaic TPU kernels, one folder each, every one beside its pure-jnp reference:
``ragged_paged_attention/``, ``kv_cache_update/``, ``streamed_matmul/``, ``rotary_embedding/``;
``kv_pool/``: the interleaved KV pool (float and 8-bit) the attention and update kernels share;
``tiling.py``: the vector-register tiling they size their blocks by."""

from pallas_kernels.tpu.kv_cache_update import update_kv_cache_reference, update_kv_cache_tpu
from pallas_kernels.tpu.kv_pool import (
    deinterleave_kv,
    interleave_kv,
    kv_pool_shape,
    padded_head_dim,
    padded_num_kv_heads,
)
from pallas_kernels.tpu.ragged_paged_attention import (
    attention_cost,
    default_block_sizes,
    ragged_paged_attention_reference_tpu,
    ragged_paged_attention_tpu,
)
from pallas_kernels.tpu.rotary_embedding import (
    rotary_embedding_reference,
    rotary_embedding_supported,
    rotary_embedding_tpu,
)
from pallas_kernels.tpu.streamed_matmul import (
    streamed_matmul_plan,
    streamed_matmul_reference,
    streamed_matmul_tpu,
)

__all__ = [
    "attention_cost",
    "default_block_sizes",
    "deinterleave_kv",
    "interleave_kv",
    "kv_pool_shape",
    "padded_head_dim",
    "padded_num_kv_heads",
    "ragged_paged_attention_reference_tpu",
    "ragged_paged_attention_tpu",
    "rotary_embedding_reference",
    "rotary_embedding_supported",
    "rotary_embedding_tpu",
    "streamed_matmul_plan",
    "streamed_matmul_reference",
    "streamed_matmul_tpu",
    "update_kv_cache_reference",
    "update_kv_cache_tpu",
]
