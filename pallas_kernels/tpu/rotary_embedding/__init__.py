"""RoPE on TPU in one pass through VMEM (``kernel.py``), beside its pure-jnp reference."""

from pallas_kernels.tpu.rotary_embedding.kernel import (
    rotary_embedding_supported,
    rotary_embedding_tables,
    rotary_embedding_tpu,
)
from pallas_kernels.tpu.rotary_embedding.reference import rotary_embedding_reference

__all__ = [
    "rotary_embedding_reference",
    "rotary_embedding_supported",
    "rotary_embedding_tables",
    "rotary_embedding_tpu",
]
