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
import threading

import jax.numpy as jnp
from flax import nnx

from jaxgen.backends.batch_invariant import invariant_attention
from jaxgen.backends.cpu_kernels import (
    PackedQuantizedWeight,
    PackedWeight,
    can_pack,
    can_pack_quantized,
    matmul_kernel_available,
    pack_shared,
    paged_attention_cpu,
    quantized_matmul_available,
)
from jaxgen.backends.paired_pool import PairedPoolBackend
from jaxgen.layers.attention import row_sequences
from jaxgen.quantization import is_quantized


def pack_kernel(kernel):
    """``kernel`` in the native matmul's form: a float32 array as a ``PackedWeight``, an int8 /
    int4 ``QuantizedWeight`` (or a bit-plane one, widened to them: the panels have no 2-, 3-,
    5- or 6-bit tiles) as a ``PackedQuantizedWeight``; others unchanged (XLA's path)."""
    if is_quantized(kernel):
        if kernel.kind == "fp8":
            raise ValueError(
                "quantization='fp8': the 'cpu' attention backend has no fp8 matmul; use "
                "attention_backend='reference' (XLA) or quantization 'int8' / 'int4'"
            )
        return PackedQuantizedWeight.pack(kernel) if _packs_quantized(kernel) else kernel
    return PackedWeight.pack(kernel) if can_pack(kernel) else kernel


def pack_linear_weights(params: nnx.State, head=None):
    """``(params, head)`` with every ``Linear`` kernel of ``params``, and ``head`` (a kernel, or
    None) in the native matmul's form (:func:`pack_kernel`; others shared). The int8 / int4
    kernels, the head's included, are packed into shared buffers (``pack_shared``): a step
    then passes three or four arrays for them all."""
    flat = list(nnx.to_flat_state(params))
    shared, kernels = [], []
    for index, (path, var) in enumerate(flat):
        if path[-1] != "kernel":
            continue
        kernel = var.get_value()
        if _packs_quantized(kernel):
            shared.append(index)
            kernels.append(kernel)
        else:
            flat[index] = (path, var.replace(pack_kernel(kernel)))
    head_shared = head is not None and _packs_quantized(head)
    packed = pack_shared(kernels + [head] * head_shared) if kernels or head_shared else []
    for index, weight in zip(shared, packed, strict=False):
        path, var = flat[index]
        flat[index] = (path, var.replace(weight))
    if head_shared:
        head = packed[-1]
    elif head is not None:
        head = pack_kernel(head)
    return nnx.from_flat_state(flat), head


def _packs_quantized(kernel) -> bool:
    """Whether ``kernel`` is an int8 / int4 weight the native quantised matmul takes."""
    return is_quantized(kernel) and can_pack_quantized(kernel) and quantized_matmul_available()


@dataclasses.dataclass(frozen=True)
class CPUBackend(PairedPoolBackend):
    name = "cpu"
    full_width_tables = True
    shard_kernels = True  # the native attention runs per device under tensor parallelism

    def prepare_params(self, params, config):
        """Packed ``Linear`` kernels, and a tied embedding packed as the LM head kernel. Under
        tensor parallelism the weights stay as placed (XLA's dot, split as the weights are):
        the packed panels hold a whole kernel. Under ``batch_invariant`` XLA's dot in fixed row
        chunks instead (``PairedPoolBackend.invariant_params``)."""
        if self.batch_invariant:
            return self.invariant_params(params, config)
        if not matmul_kernel_available() or self.degree > 1:
            return params, None
        if not config.tie_word_embeddings:
            return pack_linear_weights(params)
        table = params["embed_tokens"]["embedding"].get_value()
        return pack_linear_weights(params, table if is_quantized(table) else table.T)

    def paged_attention(self, q, k_pages, v_pages, md, **opts):
        if self.batch_invariant:  # the native kernel's prefill rows split by the step
            return invariant_attention(q, k_pages, v_pages, md, **opts)
        lengths, block_tables = _kernel_rows(md, q.shape[0])
        return paged_attention_cpu(q, k_pages, v_pages, lengths, block_tables, **opts)


# The last step's kernel rows, per tracing thread: every layer of a step attends with the same
# metadata, so its rows are traced once per step rather than once per layer (each jnp op and
# gather costs tracing time: a second and more of a 30-layer model's start-up).
_last_rows = threading.local()


def _kernel_rows(md, num_tokens: int):
    """Per token row: its kernel length ``[T]`` (0 for a padding row) and its sequence's block
    table ``[T, W]``, computed once per ``md`` object (one step's trace)."""
    cached = getattr(_last_rows, "entry", None)
    if cached is not None and cached[0] is md and cached[1] == num_tokens:
        return cached[2]
    seq, position, real = row_sequences(md, num_tokens)
    rows = (jnp.where(real, position + 1, 0).astype(jnp.int32), md.block_tables[seq])
    _last_rows.entry = (md, num_tokens, rows)  # holds md, so its identity is not reused
    return rows
