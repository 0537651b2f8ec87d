"""Pallas kernels, each beside its pure-JAX reference: ``gpu/`` (Triton) and ``tpu/`` (Mosaic)."""

from pallas_kernels.gpu.ragged_paged_attention import (
    paged_attention_reference,
    ragged_paged_attention,
    ragged_paged_attention_reference,
)

__all__ = [
    "paged_attention_reference",
    "ragged_paged_attention",
    "ragged_paged_attention_reference",
]
