"""Pure-jnp reference of ``ragged_paged_attention_tpu``, on the same interleaved pool."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.tpu.kv_pool.layout import deinterleave_kv

# The score of a masked (row, key) pair, in the kernel and here: finite, so a row with no key
# left gives zeros rather than NaNs.
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def ragged_paged_attention_reference_tpu(
    q: jax.Array,  # [T, Hq, D]
    kv_pages: jax.Array,  # [P, S, C, Dp]
    kv_lens: jax.Array,  # [max_seqs]
    block_tables: jax.Array,  # [max_seqs, W]
    cu_q_lens: jax.Array,  # [max_seqs + 1]
    num_seqs: jax.Array,  # [1]
    *,
    scale: float,
    soft_cap: float | None = None,
    sliding_window: int | None = None,
    num_kv_heads: int | None = None,
) -> jax.Array:  # [T, Hq, D]
    """Dense f32 attention per token; rows owned by no sequence in use are zeros."""
    num_tokens, num_q_heads, head_dim = q.shape
    _, page_size, num_rows, _ = kv_pages.shape
    num_kv_heads = num_kv_heads or num_rows // 2
    group = num_q_heads // num_kv_heads
    max_seqs, width = block_tables.shape
    rows = jnp.arange(num_tokens)
    used = jnp.arange(max_seqs) < num_seqs[0]
    # Sequence of each row (-1: none), from the [T, max_seqs] ownership matrix.
    owns = used[None, :] & (rows[:, None] >= cu_q_lens[None, :-1])
    owns &= rows[:, None] < cu_q_lens[None, 1:]
    seq = jnp.where(owns.any(axis=1), jnp.argmax(owns, axis=1), -1)  # [T]
    safe_seq = jnp.maximum(seq, 0)
    q_len = cu_q_lens[safe_seq + 1] - cu_q_lens[safe_seq]
    q_pos = kv_lens[safe_seq] - q_len + rows - cu_q_lens[safe_seq]  # [T]
    pages = kv_pages[block_tables[safe_seq]]  # [T, W, S, C, Dp]
    k, v = deinterleave_kv(pages, num_kv_heads, head_dim)  # [T, W, S, Hkv, D]
    k = k.reshape(num_tokens, width * page_size, num_kv_heads, head_dim).astype(jnp.float32)
    v = v.reshape(num_tokens, width * page_size, num_kv_heads, head_dim).astype(jnp.float32)
    qg = q.reshape(num_tokens, num_kv_heads, group, head_dim).astype(jnp.float32)
    scores = jnp.einsum("thgd,tkhd->thgk", qg, k) * scale
    if soft_cap is not None:
        scores = soft_cap * jnp.tanh(scores / soft_cap)
    key_pos = jnp.arange(width * page_size)[None, :]
    valid = (key_pos <= q_pos[:, None]) & (seq[:, None] >= 0)  # [T, K]
    if sliding_window is not None:
        valid &= key_pos > q_pos[:, None] - sliding_window
    valid = valid[:, None, None, :]
    scores = jnp.where(valid, scores, MASK_VALUE)
    probs = jnp.where(valid, jax.nn.softmax(scores, axis=-1), 0.0)
    out = jnp.einsum("thgk,tkhd->thgd", probs, v)
    return out.reshape(num_tokens, num_q_heads, head_dim).astype(q.dtype)
