"""The TPU pool update: a step's new K/V rows written into their slots in place, on a float pool
(``kernel.py``) or an 8-bit one (``quantized.py``: quantised, codes and scales), beside the
pure-jnp references (``reference.py``)."""

from pallas_kernels.tpu.kv_cache_update.kernel import update_kv_cache_tpu
from pallas_kernels.tpu.kv_cache_update.quantized import update_quantized_pool_tpu
from pallas_kernels.tpu.kv_cache_update.reference import (
    update_kv_cache_reference,
    update_quantized_pool_reference,
)

__all__ = [
    "update_kv_cache_reference",
    "update_kv_cache_tpu",
    "update_quantized_pool_reference",
    "update_quantized_pool_tpu",
]
