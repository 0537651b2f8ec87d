"""Quantised weights: the representation every backend takes (``QuantizedWeight``), quantising
float kernels at load, and the rules that pick which parameters are quantised."""

from jaxgen.quantization.quantize import (
    QUANTIZATION_CHOICES,
    QuantizationSpec,
    quantize_kernel,
    spec_for_path,
    validate_quantization,
)
from jaxgen.quantization.quantized_weight import (
    KINDS,
    QuantizedWeight,
    is_quantized,
    pack_int4,
    unpack_int4,
)

__all__ = [
    "KINDS",
    "QUANTIZATION_CHOICES",
    "QuantizationSpec",
    "QuantizedWeight",
    "is_quantized",
    "pack_int4",
    "quantize_kernel",
    "spec_for_path",
    "unpack_int4",
    "validate_quantization",
]
