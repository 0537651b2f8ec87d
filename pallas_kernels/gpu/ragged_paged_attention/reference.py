"""Pure-``jnp`` references for paged attention, in float32: every kernel is tested against them.

``ragged_paged_attention_reference`` takes the ragged step (decode and prefill rows together);
``paged_attention_reference`` is its decode special case (one query per sequence, at the last
position), the contract of the native CPU kernel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.ragged_layout import MASK_VALUE, gather_pages, sanitize_cu_q_lens


def ragged_paged_attention_reference(
    q: jax.Array,  # [T, Hq, D]
    k_pages: jax.Array,  # [Hkv, P, S, D]
    v_pages: jax.Array,  # [Hkv, P, S, D]
    kv_lens: jax.Array,  # [max_seqs]
    block_tables: jax.Array,  # [max_seqs, W]
    cu_q_lens: jax.Array,  # [max_seqs + 1]
    num_seqs: jax.Array,  # [1]
    *,
    scale: float | None = None,
    soft_cap: float | None = None,
    sliding_window: int | None = None,
) -> jax.Array:  # [T, Hq, D]
    """Causal attention of each sequence's rows over its pages, with the arguments of
    ``ragged_paged_attention_gpu`` (float pools: dequantise an 8-bit one first). Rows not covered by
    the first ``num_seqs`` sequences are zero."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, _, page_size, _ = k_pages.shape
    group = num_heads // num_kv_heads
    max_seqs, width = block_tables.shape
    scale = head_dim**-0.5 if scale is None else scale
    cu_q_lens = sanitize_cu_q_lens(cu_q_lens, num_seqs, num_tokens)
    rows = jnp.arange(num_tokens)
    seq = jnp.clip(jnp.searchsorted(cu_q_lens[1:], rows, side="right"), 0, max_seqs - 1)
    in_use = (rows < cu_q_lens[-1]) & (seq < num_seqs[0])
    q_len = cu_q_lens[seq + 1] - cu_q_lens[seq]
    q_pos = kv_lens[seq] - q_len + (rows - cu_q_lens[seq])  # [T]
    qg = q.reshape(num_tokens, num_kv_heads, group, head_dim).astype(jnp.float32) * scale
    key_pos = jnp.arange(width * page_size)

    def attend_sequence(s, out):  # one sequence at a time: [T, W * S] scores, not [.., Hkv, D]
        k = gather_pages(k_pages, block_tables[s]).reshape(
            num_kv_heads, width * page_size, head_dim
        )
        v = gather_pages(v_pages, block_tables[s]).reshape(
            num_kv_heads, width * page_size, head_dim
        )
        scores = jnp.einsum("thgd,hld->thgl", qg, k.astype(jnp.float32))
        if soft_cap is not None:
            scores = soft_cap * jnp.tanh(scores / soft_cap)
        valid = (key_pos[None, :] <= q_pos[:, None]) & (key_pos[None, :] < kv_lens[s])
        if sliding_window is not None:
            valid &= key_pos[None, :] > q_pos[:, None] - sliding_window
        valid &= ((seq == s) & in_use)[:, None]
        scores = jnp.where(valid[:, None, None, :], scores, MASK_VALUE)
        probs = jnp.where(valid[:, None, None, :], jax.nn.softmax(scores, axis=-1), 0.0)
        return out + jnp.einsum("thgl,hld->thgd", probs, v.astype(jnp.float32)).reshape(out.shape)

    out = jnp.zeros((num_tokens, num_heads, head_dim), jnp.float32)
    out = jax.lax.fori_loop(0, max_seqs, attend_sequence, out)
    return out.astype(q.dtype)


def paged_attention_reference(
    q: jax.Array,  # [B, Hq, D]
    k_pages: jax.Array,  # [Hkv, P, S, D]
    v_pages: jax.Array,  # [Hkv, P, S, D]
    lengths: jax.Array,  # [B]
    block_tables: jax.Array,  # [B, W]
    *,
    scale: float | None = None,
    soft_cap: float | None = None,
    sliding_window: int | None = None,
) -> jax.Array:  # [B, Hq, D]
    """Decode attention: each sequence's one query (at position ``lengths - 1``) over its
    ``lengths`` cached keys; the window keeps the last ``sliding_window``. Rows with
    ``lengths == 0`` return zeros."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads, _, page_size, _ = k_pages.shape
    group = num_heads // num_kv_heads
    width = block_tables.shape[1]
    scale = head_dim**-0.5 if scale is None else scale
    k = gather_pages(k_pages, block_tables).reshape(
        num_kv_heads, batch, width * page_size, head_dim
    )
    v = gather_pages(v_pages, block_tables).reshape(
        num_kv_heads, batch, width * page_size, head_dim
    )
    qg = q.reshape(batch, num_kv_heads, group, head_dim).astype(jnp.float32) * scale
    scores = jnp.einsum("bhgd,hbld->bhgl", qg, k.astype(jnp.float32))
    if soft_cap is not None:
        scores = soft_cap * jnp.tanh(scores / soft_cap)
    key_pos = jnp.arange(width * page_size)[None, :]
    valid = key_pos < lengths[:, None]
    if sliding_window is not None:
        valid &= key_pos >= lengths[:, None] - sliding_window
    scores = jnp.where(valid[:, None, None, :], scores, MASK_VALUE)
    probs = jnp.where(valid[:, None, None, :], jax.nn.softmax(scores, axis=-1), 0.0)
    out = jnp.einsum("bhgl,hbld->bhgd", probs, v.astype(jnp.float32))
    return out.reshape(batch, num_heads, head_dim).astype(q.dtype)
