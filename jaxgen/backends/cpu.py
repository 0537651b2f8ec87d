"""The native CPU backend: C++ paged attention and panel-packed matmuls through the XLA FFI.

Every token of a step is one row of the paged kernel (the ``token_rows`` layout), and the step
runs on a copy of the parameters whose ``Linear`` kernels are panel-packed for the native matmul.
"""

from __future__ import annotations

import dataclasses

from jaxgen.backends.paired_pool import PairedPoolBackend
from jaxgen.models.linear import pack_linear_weights
from pallas_kernels.matmul_cpu import matmul_kernel_available, pack_weight
from pallas_kernels.paged_attention_cpu import paged_attention_cpu


@dataclasses.dataclass(frozen=True)
class CPUBackend(PairedPoolBackend):
    name = "cpu"
    token_rows = True

    def prepare_params(self, params, config):
        """Packed ``Linear`` kernels, and a tied embedding packed as the LM head."""
        if not matmul_kernel_available():
            return params, None
        head = None
        if config.tie_word_embeddings:
            head = pack_weight(params["embed_tokens"]["embedding"][...].T)
        return pack_linear_weights(params), head

    def decode_attention(self, q, k_pages, v_pages, md, **opts):
        return paged_attention_cpu(
            q, k_pages, v_pages, md.decode_lengths, md.decode_block_tables, **opts
        )
