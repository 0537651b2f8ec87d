"""The Pallas GPU backend: the ragged paged-attention kernel of ``pallas_kernels`` over every row of
the step (Pallas's interpreter on CPU, which is how the tests run it). An 8-bit pool
(``kv_cache_dtype`` "int8" / "fp8") reaches the kernel as codes and scales, dequantised per key
block inside it."""

from __future__ import annotations

import dataclasses

from jaxgen.backends.paired_pool import PairedPoolBackend
from pallas_kernels import ragged_paged_attention


@dataclasses.dataclass(frozen=True)
class PallasGPUBackend(PairedPoolBackend):
    """``interpret``: run the kernels in Pallas's interpreter (on CPU, for tests); set by
    ``select_backend`` from the platform, so lowering for CUDA from a CPU host emits the
    kernels themselves."""

    name = "pallas-gpu"
    interpret: bool = False
    shard_kernels = True  # a Triton call is opaque to XLA's partitioner: one per device

    def paged_attention(self, q, k_pages, v_pages, md, **opts):
        return ragged_paged_attention(
            q,
            k_pages,
            v_pages,
            md.kv_lens,
            md.block_tables,
            md.cu_q_lens,
            md.num_seqs,
            interpret=self.interpret,
            **opts,
        )
