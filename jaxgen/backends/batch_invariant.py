"""Batch-invariant forms of a step's reductions (``EngineConfig.batch_invariant``).

A token row's result must not depend on which other rows share its step. Reductions of a
plain step do: XLA's dot picks its blocking from the row count M (which the step's bucket, so
the batch, sets), the reference attention reduces over a key axis as long as the step's
longest sequence, in query blocks sized by the step, and the "cpu" backend's native attention
splits a step's prefill rows by the step. Under ``batch_invariant`` a backend
(jaxgen/backends/reference.py, cpu.py) runs:

- every plain ``Linear`` kernel, and the LM head, as a :class:`RowChunkedWeight`: the rows go
  through one ``[ROW_CHUNK, K] x [K, N]`` dot per chunk in a loop (``jax.lax.map``), the
  projection's deferred RMSNorm inside the chunk, so each row meets the same kernel with the
  same reduction order whatever the row count (quantised kernels are left as they are);
- :func:`invariant_attention`: every token row alone against its sequence's keys over the full
  block-table width (``max_model_len``), a fixed key axis, masked past the row's position, the
  rows again in fixed chunks.

Row-wise ops (the final RMSNorm, RoPE, the sampler's log-softmax over the vocabulary) were
measured invariant as they are. Known gap (docs/api.md): a sequence's decode row in a step
with other sequences' prefill chunks can still differ by an ulp.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxgen.layers.attention import row_sequences
from jaxgen.layers.linear import NormedInput, rms_norm
from jaxgen.quantization.kv_cache import QuantizedPages
from pallas_kernels.ragged_layout import MASK_VALUE, gather_pages

ROW_CHUNK = 16  # token rows per fixed-shape matmul chunk
ATTENTION_CHUNK = 16  # token rows per attention chunk


def _row_chunks(x: jax.Array, fn, chunk: int = ROW_CHUNK) -> jax.Array:
    """``fn`` over ``x``'s rows ([R, ...]) in chunks of ``chunk`` rows, one at a time (padding
    rows are zeros and dropped): every chunk runs the same computation of one shape."""
    rows = x.shape[0]
    padded = -(-rows // chunk) * chunk
    x = jnp.pad(x, [(0, padded - rows)] + [(0, 0)] * (x.ndim - 1))
    out = jax.lax.map(fn, x.reshape(padded // chunk, chunk, *x.shape[1:]))
    return jax.tree.map(lambda y: y.reshape(padded, *y.shape[2:])[:rows], out)


def chunked_dots(x, kernels: list) -> list[jax.Array]:
    """``[x @ w for w in kernels]`` in fixed row chunks (module docstring); ``x`` ([..., K]) may
    be a ``NormedInput``, normed chunk by chunk."""
    normed = isinstance(x, NormedInput)
    rows_in = x.x if normed else x
    lead = rows_in.shape[:-1]
    flat = rows_in.reshape(math.prod(lead), rows_in.shape[-1])

    def chunk_dots(rows):
        if normed:
            rows = rms_norm(rows, x.weight, x.eps)
        return [jnp.dot(rows, w) for w in kernels]

    outs = _row_chunks(flat, chunk_dots)
    return [out.reshape(*lead, out.shape[-1]) for out in outs]


@functools.partial(jax.tree_util.register_dataclass, data_fields=["kernel"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class RowChunkedWeight:
    """A plain [K, N] ``Linear`` kernel whose matmul runs in fixed row chunks, its input's
    RMSNorm too; it provides the kernel protocol of ``jaxgen.layers.linear`` (``matmul``,
    ``matmul_group``, ``norms_input``). Every row is computed (padding rows included, as
    ``jnp.dot``), so ``live_rows`` is not read."""

    kernel: jax.Array  # [K, N]
    norms_input = True

    @property
    def shape(self) -> tuple[int, int]:
        return self.kernel.shape

    @property
    def dtype(self):
        return self.kernel.dtype

    def matmul(self, x, live_rows: jax.Array | None = None) -> jax.Array:
        return chunked_dots(x, [self.kernel])[0]

    @staticmethod
    def matmul_group(x, weights: list, live_rows: jax.Array | None = None) -> list[jax.Array]:
        return chunked_dots(x, [weight.kernel for weight in weights])


def chunk_kernel(kernel):
    """``kernel`` as a :class:`RowChunkedWeight` when it is a plain array, else None."""
    return RowChunkedWeight(kernel) if isinstance(kernel, jax.Array) else None


def unchunked_kernels(params: nnx.State) -> list[str]:
    """The type names of the ``Linear`` kernels (and embedding table) of ``params`` that
    :func:`chunk_kernel` does not take: quantised ones."""
    return sorted(
        {
            type(var.get_value()).__name__
            for path, var in nnx.to_flat_state(params)
            if path[-1] in ("kernel", "embedding") and not isinstance(var.get_value(), jax.Array)
        }
    )


def invariant_attention(
    q: jax.Array,  # [T, Hq, D]
    k_pages,  # [Hkv, P, S, D], or QuantizedPages
    v_pages,
    md,
    *,
    scale: float,
    soft_cap: float | None = None,
    sliding_window: int | None = None,
) -> jax.Array:  # [T, Hq, D]
    """Causal attention of every token row alone over its sequence's full-width block table
    (module docstring); ``md.block_tables`` must be full width."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, _, page_size, _ = k_pages.shape
    group = num_heads // num_kv_heads
    seq, position, real = row_sequences(md, num_tokens)
    position = jnp.where(real, position, -1)
    tables = md.block_tables[seq]  # [T, W]
    length = tables.shape[1] * page_size
    key_pos = jnp.arange(length)

    def rows_attention(chunk):
        q_rows, rows_tables, rows_pos = chunk
        rows = q_rows.shape[0]
        k = _gather(k_pages, rows_tables).reshape(num_kv_heads, rows, length, head_dim)
        v = _gather(v_pages, rows_tables).reshape(num_kv_heads, rows, length, head_dim)
        qg = q_rows.reshape(rows, num_kv_heads, group, head_dim).astype(jnp.float32) * scale
        scores = jnp.einsum("thgd,htld->thgl", qg, k.astype(jnp.float32))
        if soft_cap is not None:
            scores = soft_cap * jnp.tanh(scores / soft_cap)
        valid = key_pos[None, :] <= rows_pos[:, None]  # [C, L]
        if sliding_window is not None:
            valid &= key_pos[None, :] > rows_pos[:, None] - sliding_window
        valid = valid[:, None, None]
        probs = jax.nn.softmax(jnp.where(valid, scores, MASK_VALUE), axis=-1)
        probs = jnp.where(valid, probs, 0.0)
        out = jnp.einsum("thgl,htld->thgd", probs, v.astype(jnp.float32))
        return out.reshape(rows, num_heads, head_dim).astype(q.dtype)

    chunk = ATTENTION_CHUNK
    padded = -(-num_tokens // chunk) * chunk
    pad = padded - num_tokens

    def split(a, fill=0):
        a = jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1), constant_values=fill)
        return a.reshape(padded // chunk, chunk, *a.shape[1:])

    out = jax.lax.map(rows_attention, (split(q), split(tables), split(position, -1)))
    return out.reshape(padded, num_heads, head_dim)[:num_tokens]


def _gather(pages, block_tables: jax.Array) -> jax.Array:
    """The tables' pages ([Hkv, C, W, S, D]); an 8-bit pool dequantises only those."""
    if isinstance(pages, QuantizedPages):
        return pages.gather(block_tables)
    return gather_pages(pages, block_tables)
