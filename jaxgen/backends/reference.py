"""The XLA reference backend: gathers each row's pages and attends in plain ``jnp``."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxgen.backends.paired_pool import PairedPoolBackend
from pallas_kernels.paged_attention import MASK_VALUE, gather_pages, paged_attention_reference


def blocked_prefill_attention(
    q: jax.Array,  # [Tp, Hq, D]
    k_pages: jax.Array,  # [Hkv, P, S, D]
    v_pages: jax.Array,  # [Hkv, P, S, D]
    query_index: jax.Array,  # [Nb, Bq]
    query_positions: jax.Array,  # [Nb, Bq]
    block_tables: jax.Array,  # [Nb, Wp]
    *,
    scale: float,
    soft_cap: float | None = None,
    sliding_window: int | None = None,
) -> jax.Array:  # [Tp, Hq, D]
    """Causal prefill attention in plain XLA: query blocks of one sequence each, against its pages."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, _, page_size, _ = k_pages.shape
    group = num_heads // num_kv_heads
    num_blocks, block_q = query_index.shape
    length = block_tables.shape[1] * page_size
    q_padded = jnp.concatenate([q, jnp.zeros((1, num_heads, head_dim), q.dtype)], axis=0)
    qb = q_padded[query_index].reshape(num_blocks, block_q, num_kv_heads, group, head_dim)
    k = gather_pages(k_pages, block_tables).reshape(num_kv_heads, num_blocks, length, head_dim)
    v = gather_pages(v_pages, block_tables).reshape(num_kv_heads, num_blocks, length, head_dim)
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


@dataclasses.dataclass(frozen=True)
class ReferenceBackend(PairedPoolBackend):
    """Pure XLA: decode rows through ``paged_attention_reference``, prefill in query blocks."""

    name = "reference"

    def decode_attention(self, q, k_pages, v_pages, md, **opts):
        return paged_attention_reference(
            q, k_pages, v_pages, md.decode_lengths, md.decode_block_tables, **opts
        )

    def prefill_attention(self, q, k_pages, v_pages, md, **opts):
        return blocked_prefill_attention(
            q,
            k_pages,
            v_pages,
            md.prefill_query_index,
            md.prefill_query_positions,
            md.prefill_block_tables,
            **opts,
        )
