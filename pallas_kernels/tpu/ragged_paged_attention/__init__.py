"""Ragged paged attention on TPU: decode rows and prefill chunks in one Mosaic kernel, over a
float or 8-bit pool, beside its pure-jnp reference.

``kernel.py``: the entry point, the kernel body and its ``pallas_call`` with the float pool's
part; ``quantized.py``: the 8-bit pool's part; ``walk.py``: the (sequence, KV block) walk, its
DMAs and the online softmax; ``sizes.py``: default block sizes and the cost estimate;
``validation.py``: argument checks; ``reference.py``: the reference.
"""

from pallas_kernels.tpu.ragged_paged_attention.kernel import ragged_paged_attention_tpu
from pallas_kernels.tpu.ragged_paged_attention.reference import (
    ragged_paged_attention_reference_tpu,
)
from pallas_kernels.tpu.ragged_paged_attention.sizes import attention_cost, default_block_sizes

__all__ = [
    "attention_cost",
    "default_block_sizes",
    "ragged_paged_attention_reference_tpu",
    "ragged_paged_attention_tpu",
]
