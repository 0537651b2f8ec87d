"""The Pallas GPU backend: the decode and ragged-prefill kernels of ``pallas_kernels`` (Triton on
a GPU; Pallas's interpreter on CPU, which is how the tests run them)."""

from __future__ import annotations

import dataclasses

from jaxgen.backends.paired_pool import PairedPoolBackend
from pallas_kernels import paged_attention, ragged_paged_attention


@dataclasses.dataclass(frozen=True)
class PallasGPUBackend(PairedPoolBackend):
    """``interpret``: run the kernels in Pallas's interpreter (on CPU, for tests); set by
    ``select_backend`` from the platform, so lowering for CUDA from a CPU host emits the
    kernels themselves."""

    name = "pallas-gpu"
    interpret: bool = False

    def decode_attention(self, q, k_pages, v_pages, md, **opts):
        return paged_attention(
            q,
            k_pages,
            v_pages,
            md.decode_lengths,
            md.decode_block_tables,
            interpret=self.interpret,
            **opts,
        )

    def prefill_attention(self, q, k_pages, v_pages, md, **opts):
        return ragged_paged_attention(
            q,
            k_pages,
            v_pages,
            md.prefill_kv_lens,
            md.prefill_seq_block_tables,
            md.prefill_cu_q_lens,
            md.prefill_num_seqs,
            interpret=self.interpret,
            **opts,
        )
