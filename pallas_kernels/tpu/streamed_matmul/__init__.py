"""The streamed matmul on TPU: a decode step's ``x @ w`` with the weight left in HBM and streamed
through VMEM column block by column block, float (``kernel.py``) or int8 / int4 dequantised in
VMEM (``quantized.py``), plain or gated, optionally normed first; the stream they share
(``stream.py``), the elementwise math around the products (``elementwise.py``), float16 scales
as packed pairs (``float16_pairs.py``) and the pure-jnp references (``reference.py``)."""

from pallas_kernels.tpu.streamed_matmul.elementwise import GATED_ACTIVATIONS
from pallas_kernels.tpu.streamed_matmul.float16_pairs import (
    float16_bits_to_float32,
    pack_float16_pairs,
    unpack_float16_pairs,
)
from pallas_kernels.tpu.streamed_matmul.kernel import (
    StreamedMatmulPlan,
    streamed_gated_matmul_tpu,
    streamed_matmul_plan,
    streamed_matmul_tpu,
)
from pallas_kernels.tpu.streamed_matmul.quantized import (
    streamed_gated_matmul_quantized_tpu,
    streamed_matmul_quantized_plan,
    streamed_matmul_quantized_tpu,
)
from pallas_kernels.tpu.streamed_matmul.reference import (
    rms_norm_reference,
    streamed_gated_matmul_reference,
    streamed_matmul_reference,
)

__all__ = [
    "GATED_ACTIVATIONS",
    "StreamedMatmulPlan",
    "float16_bits_to_float32",
    "pack_float16_pairs",
    "rms_norm_reference",
    "streamed_gated_matmul_quantized_tpu",
    "streamed_gated_matmul_reference",
    "streamed_gated_matmul_tpu",
    "streamed_matmul_plan",
    "streamed_matmul_quantized_plan",
    "streamed_matmul_quantized_tpu",
    "streamed_matmul_reference",
    "streamed_matmul_tpu",
    "unpack_float16_pairs",
]
