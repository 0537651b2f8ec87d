"""Pallas kernels for paged attention, each beside its pure-JAX reference."""

from pallas_kernels.paged_attention import paged_attention, paged_attention_reference
from pallas_kernels.ragged_paged_attention import (
    ragged_paged_attention,
    ragged_paged_attention_reference,
)

__all__ = [
    "paged_attention",
    "paged_attention_reference",
    "ragged_paged_attention",
    "ragged_paged_attention_reference",
]
