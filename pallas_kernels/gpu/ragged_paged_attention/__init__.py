"""Ragged paged attention for NVIDIA GPUs (Pallas Triton): split-KV decode programs, one per KV
head's GQA group (padded to tl.dot's 16 rows), causal prefill blocks, float and 8-bit pools. See
docs/gpu.md."""

from pallas_kernels.gpu.ragged_paged_attention.reference import (
    paged_attention_reference,
    ragged_paged_attention_reference,
)
from pallas_kernels.gpu.ragged_paged_attention.sizes import (
    DecodeSizes,
    PrefillSizes,
    decode_sizes,
    prefill_sizes,
)
from pallas_kernels.gpu.ragged_paged_attention.wrapper import TUNING, ragged_paged_attention_gpu

__all__ = [
    "TUNING",
    "DecodeSizes",
    "PrefillSizes",
    "decode_sizes",
    "paged_attention_reference",
    "prefill_sizes",
    "ragged_paged_attention_gpu",
    "ragged_paged_attention_reference",
]
