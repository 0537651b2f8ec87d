"""The step's new K/V written into a paired float pool by one Pallas Triton kernel, in place
(``pallas_merge``'s companion on a batch-1 step: one launch where XLA makes two scatters)."""

from pallas_kernels.gpu.kv_write.wrapper import write_kv, write_kv_reference

__all__ = ["write_kv", "write_kv_reference"]
