"""The native XLA:CPU kernels of the "cpu" backend: C++ under ``native/``, built on first use
(``build``) and called through the XLA FFI.

- ``paged_attention``: paged decode attention (``paged_attention_cpu``).
- ``matmul``: float32 matmul over panel-packed weights (``PackedWeight``, ``matmul_cpu``).
"""

from jaxgen.backends.cpu_kernels.matmul import (
    PackedWeight,
    can_pack,
    matmul_cpu,
    matmul_cpu_group,
    matmul_kernel_available,
    pack_weight,
    unpack_weight,
)
from jaxgen.backends.cpu_kernels.paged_attention import cpu_kernel_available, paged_attention_cpu

__all__ = [
    "PackedWeight",
    "can_pack",
    "cpu_kernel_available",
    "matmul_cpu",
    "matmul_cpu_group",
    "matmul_kernel_available",
    "pack_weight",
    "paged_attention_cpu",
    "unpack_weight",
]
