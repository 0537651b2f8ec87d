"""The native XLA:CPU kernels of the "cpu" backend: C++ under ``native/``, built at ``pip install``
(``compile``) or else on first use (``build``), and called through the XLA FFI.

- ``paged_attention``: paged decode attention over a float32 or 8-bit pool
  (``paged_attention_cpu``, which takes either).
- ``matmul``: float32 matmul over panel-packed weights (``PackedWeight``, ``matmul_cpu``).
- ``matmul_quantized``: int8 / int4 matmul dequantising in registers (``PackedQuantizedWeight``),
  and int8 x int8 (W8A8) on AVX-512 VNNI; ``shared_panels``: many such weights in shared
  buffers (``pack_shared``).
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
from jaxgen.backends.cpu_kernels.matmul_quantized import (
    PackedQuantizedWeight,
    can_pack_quantized,
    matmul_quantized_cpu_group,
    quantized_matmul_available,
    w8a8_kernel_available,
)
from jaxgen.backends.cpu_kernels.paged_attention import (
    cpu_kernel_available,
    paged_attention_cpu,
)
from jaxgen.backends.cpu_kernels.shared_panels import pack_shared


def native_kernels_available() -> tuple[bool, ...]:
    """Builds (once) and registers every native kernel; whether each one is usable here (the
    paged attention, the float32 matmul, the quantised matmul, its int8-activation path). A
    step's executable calls the registered ones, so this runs before one is compiled or read."""
    return (
        cpu_kernel_available(),
        matmul_kernel_available(),
        quantized_matmul_available(),
        w8a8_kernel_available(),
    )


__all__ = [
    "PackedQuantizedWeight",
    "PackedWeight",
    "can_pack_quantized",
    "matmul_quantized_cpu_group",
    "pack_shared",
    "quantized_matmul_available",
    "can_pack",
    "cpu_kernel_available",
    "matmul_cpu",
    "matmul_cpu_group",
    "matmul_kernel_available",
    "native_kernels_available",
    "pack_weight",
    "paged_attention_cpu",
    "unpack_weight",
    "w8a8_kernel_available",
]
