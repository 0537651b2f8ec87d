"""The XLA reference backend: gathers each row's pages and attends in plain ``jnp``."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxgen.backends.batch_invariant import invariant_attention
from jaxgen.backends.paired_pool import PairedPoolBackend
from jaxgen.quantization.kv_cache import QuantizedPages
from pallas_kernels.ragged_layout import MASK_VALUE, gather_pages, query_blocks

QUERY_BLOCK = 16  # query rows per attention block of steps larger than their sequence slots


def blocked_prefill_attention(
    q: jax.Array,  # [Tp, Hq, D]
    k_pages: jax.Array,  # [Hkv, P, S, D], or QuantizedPages
    v_pages: jax.Array,  # [Hkv, P, S, D], or QuantizedPages
    query_index: jax.Array,  # [Nb, Bq]
    query_positions: jax.Array,  # [Nb, Bq]
    block_tables: jax.Array,  # [Nb, Wp]
    *,
    scale: float,
    soft_cap: float | None = None,
    sliding_window: int | None = None,
) -> jax.Array:  # [Tp, Hq, D]
    """Causal attention in plain XLA: query blocks of one sequence each, against its pages."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, _, page_size, _ = k_pages.shape
    group = num_heads // num_kv_heads
    num_blocks, block_q = query_index.shape
    length = block_tables.shape[1] * page_size
    q_padded = jnp.concatenate([q, jnp.zeros((1, num_heads, head_dim), q.dtype)], axis=0)
    qb = q_padded[query_index].reshape(num_blocks, block_q, num_kv_heads, group, head_dim)
    k = _gather(k_pages, block_tables).reshape(num_kv_heads, num_blocks, length, head_dim)
    v = _gather(v_pages, block_tables).reshape(num_kv_heads, num_blocks, length, head_dim)
    scores = jnp.einsum("nqhgd,hnld->nhgql", qb.astype(jnp.float32) * scale, k.astype(jnp.float32))
    if soft_cap is not None:
        scores = soft_cap * jnp.tanh(scores / soft_cap)
    key_pos = jnp.arange(length)
    valid = key_pos[None, None, :] <= query_positions[:, :, None]  # [Nb, Bq, L]
    if sliding_window is not None:
        valid &= key_pos[None, None, :] > query_positions[:, :, None] - sliding_window
    valid = valid[:, None, None]
    probs = jnp.where(valid, jax.nn.softmax(jnp.where(valid, scores, MASK_VALUE), axis=-1), 0.0)
    out = jnp.einsum("nhgql,hnld->nqhgd", probs, v.astype(jnp.float32))
    out = out.reshape(num_blocks * block_q, num_heads, head_dim).astype(q.dtype)
    flat = jnp.zeros((num_tokens + 1, num_heads, head_dim), q.dtype)
    return flat.at[query_index.reshape(-1)].set(out)[:num_tokens]


def _gather(pages, block_tables: jax.Array) -> jax.Array:
    """The tables' pages ([Hkv, Nb, Wp, S, D]); an 8-bit pool dequantises only those."""
    if isinstance(pages, QuantizedPages):
        return pages.gather(block_tables)
    return gather_pages(pages, block_tables)


@dataclasses.dataclass(frozen=True)
class ReferenceBackend(PairedPoolBackend):
    """Pure XLA: the step's rows cut into query blocks of one sequence each (one row a block
    when the step has no more rows than sequence slots, as decode steps), each block against
    its sequence's gathered pages. Under ``batch_invariant``: full-width block tables, the
    kernels in fixed row chunks and every row attending alone (``invariant_attention``)."""

    name = "reference"

    @property
    def full_width_tables(self) -> bool:
        return self.batch_invariant

    def prepare_params(self, params, config):
        if self.batch_invariant:
            return self.invariant_params(params, config)
        return params, None

    def paged_attention(self, q, k_pages, v_pages, md, **opts):
        if self.batch_invariant:
            return invariant_attention(q, k_pages, v_pages, md, **opts)
        num_tokens, max_seqs = q.shape[0], md.kv_lens.shape[0]
        block_q = 1 if num_tokens <= max_seqs else QUERY_BLOCK
        num_blocks = (num_tokens + min(max_seqs, num_tokens) * (block_q - 1)) // block_q
        seq, counts, first, rows = query_blocks(
            md.cu_q_lens,
            md.kv_lens,
            md.num_seqs,
            num_tokens=num_tokens,
            block_q=block_q,
            num_blocks=num_blocks,
        )
        offsets = jnp.arange(block_q, dtype=jnp.int32)[None, :]
        positions = jnp.where(offsets < counts[:, None], first[:, None] + offsets, -1)
        return blocked_prefill_attention(
            q, k_pages, v_pages, rows, positions, md.block_tables[seq], **opts
        )
