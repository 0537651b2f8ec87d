"""The native CPU backend: C++ paged attention and panel-packed matmuls through the XLA FFI.

Every token of a step is one row of the paged kernel (a prefill token at position ``p`` is a row
of length ``p + 1`` with its sequence's block table, so the causal mask is the row's length),
and the step
runs on a copy of the parameters whose float32 ``Linear`` kernels are ``PackedWeight``s (int8 /
int4 ``QuantizedWeight`` kernels: ``PackedQuantizedWeight``s): the
model's ``Linear`` runs them on the native matmul through their own methods, so the model never
imports a kernel.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from flax import nnx

from jaxgen.attention import row_sequences
from jaxgen.backends.base import replace_linear_kernels
from jaxgen.backends.cpu_kernels import (
    PackedQuantizedWeight,
    PackedWeight,
    can_pack,
    can_pack_quantized,
    matmul_kernel_available,
    paged_attention_cpu,
    paged_attention_cpu_quantized,
    quantized_matmul_available,
    share_buffers,
)
from jaxgen.backends.paired_pool import PairedPoolBackend
from jaxgen.quantization import is_quantized
from jaxgen.quantization.kv_cache import QuantizedPages


def pack_kernel(kernel):
    """``kernel`` in the native matmul's form: a float32 array as a ``PackedWeight``, an int8 /
    int4 ``QuantizedWeight`` as a ``PackedQuantizedWeight``; others unchanged (XLA's path)."""
    if is_quantized(kernel):
        if kernel.kind == "fp8":
            raise ValueError(
                "quantization='fp8': the 'cpu' attention backend has no fp8 matmul; use "
                "attention_backend='reference' (XLA) or quantization 'int8' / 'int4'"
            )
        if can_pack_quantized(kernel) and quantized_matmul_available():
            return PackedQuantizedWeight.pack(kernel)
        return kernel
    return PackedWeight.pack(kernel) if can_pack(kernel) else kernel


def pack_linear_weights(params: nnx.State) -> nnx.State:
    """A copy of ``params`` with every ``Linear`` kernel in the native matmul's form
    (:func:`pack_kernel`; others shared)."""
    return replace_linear_kernels(params, pack_kernel)


def share_quantized_buffers(packed: nnx.State, head=None) -> tuple[nnx.State, object]:
    """``packed`` (:func:`pack_linear_weights`) and ``head`` (a packed kernel, or None) with
    their ``PackedQuantizedWeight``s in shared buffers (``share_buffers``): a step then passes
    three or four arrays for them all."""
    flat = list(nnx.to_flat_state(packed))
    kernels = [
        (index, var.get_value())
        for index, (path, var) in enumerate(flat)
        if path[-1] == "kernel" and isinstance(var.get_value(), PackedQuantizedWeight)
    ]
    weights = [kernel for _, kernel in kernels]
    if isinstance(head, PackedQuantizedWeight):
        weights.append(head)
    if not weights:
        return packed, head
    shared = share_buffers(weights)
    for (index, _), weight in zip(kernels, shared, strict=False):
        path, var = flat[index]
        flat[index] = (path, var.replace(weight))
    return nnx.from_flat_state(flat), shared[-1] if len(shared) > len(kernels) else head


@dataclasses.dataclass(frozen=True)
class CPUBackend(PairedPoolBackend):
    name = "cpu"
    full_width_tables = True
    shard_kernels = True  # the native attention runs per device under tensor parallelism

    def prepare_params(self, params, config):
        """Packed ``Linear`` kernels, and a tied embedding packed as the LM head kernel. Under
        tensor parallelism the weights stay as placed (XLA's dot, split as the weights are):
        the packed panels hold a whole kernel."""
        if not matmul_kernel_available() or self.degree > 1:
            return params, None
        head = None
        if config.tie_word_embeddings:
            table = params["embed_tokens"]["embedding"].get_value()
            head = pack_kernel(table) if is_quantized(table) else PackedWeight.pack(table.T)
        return share_quantized_buffers(pack_linear_weights(params), head)

    def paged_attention(self, q, k_pages, v_pages, md, **opts):
        seq, position, real = row_sequences(md, q.shape[0])
        lengths = jnp.where(real, position + 1, 0).astype(jnp.int32)  # 0: a padding row
        kernel = (
            paged_attention_cpu_quantized
            if isinstance(k_pages, QuantizedPages)
            else paged_attention_cpu
        )
        return kernel(q, k_pages, v_pages, lengths, md.block_tables[seq], **opts)
