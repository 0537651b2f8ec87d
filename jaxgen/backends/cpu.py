"""The native CPU backend: C++ paged attention and panel-packed matmuls through the XLA FFI.

Every token of a step is one row of the paged kernel (the ``token_rows`` layout), and the step
runs on a copy of the parameters whose float32 ``Linear`` kernels are ``PackedWeight``s: the
model's ``Linear`` runs them on the native matmul through their own methods, so the model never
imports a kernel.
"""

from __future__ import annotations

import dataclasses

from flax import nnx

from jaxgen.backends.cpu_kernels import (
    PackedWeight,
    can_pack,
    matmul_kernel_available,
    paged_attention_cpu,
)
from jaxgen.backends.paired_pool import PairedPoolBackend


def pack_linear_weights(params: nnx.State) -> nnx.State:
    """A copy of ``params`` with every packable ``Linear`` kernel a ``PackedWeight`` (others
    shared)."""
    leaves = []
    for path, var in nnx.to_flat_state(params):
        value = var.get_value()
        if path[-1] == "kernel" and can_pack(value):
            var = var.replace(PackedWeight.pack(value))
        leaves.append((path, var))
    return nnx.from_flat_state(leaves)


@dataclasses.dataclass(frozen=True)
class CPUBackend(PairedPoolBackend):
    name = "cpu"
    token_rows = True

    def prepare_params(self, params, config):
        """Packed ``Linear`` kernels, and a tied embedding packed as the LM head kernel."""
        if not matmul_kernel_available():
            return params, None
        head = None
        if config.tie_word_embeddings:
            head = PackedWeight.pack(params["embed_tokens"]["embedding"][...].T)
        return pack_linear_weights(params), head

    def decode_attention(self, q, k_pages, v_pages, md, **opts):
        return paged_attention_cpu(
            q, k_pages, v_pages, md.decode_lengths, md.decode_block_tables, **opts
        )
