"""Pure-jnp references for the TPU kernels (attention and the KV update on the same interleaved
pool layout; the streamed matmuls; RoPE)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.tpu.kv_cache_update import deinterleave_kv, interleave_kv
from pallas_kernels.tpu.streamed_matmul import gated

MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def update_kv_cache_reference(
    kv_pages: jax.Array,  # [P, S, C, Dp]
    new_k: jax.Array,  # [T, Hkv, D]
    new_v: jax.Array,  # [T, Hkv, D]
    slot_mapping: jax.Array,  # [T] int32
) -> jax.Array:  # [P, S, C, Dp]
    """Scatter of each token's interleaved K/V row into its slot; out-of-range slots dropped."""
    num_pages, page_size, num_rows, head_dim_padded = kv_pages.shape
    rows = interleave_kv(
        new_k.astype(kv_pages.dtype),
        new_v.astype(kv_pages.dtype),
        num_rows=num_rows,
        head_dim_padded=head_dim_padded,
    )  # [T, C, Dp]
    num_slots = num_pages * page_size
    slots = jnp.where((slot_mapping >= 0) & (slot_mapping < num_slots), slot_mapping, num_slots)
    flat = kv_pages.reshape(num_slots, num_rows, head_dim_padded)
    return flat.at[slots].set(rows, mode="drop").reshape(kv_pages.shape)


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


def streamed_matmul_reference(
    x: jax.Array, w: jax.Array, *, transposed: bool = False
) -> jax.Array:  # [M, N]
    """Pure-jnp ``x @ w`` (``x @ w.T`` when ``transposed``), f32 accumulation, x's dtype."""
    weight = w.T if transposed else w
    return jnp.dot(x, weight, preferred_element_type=jnp.float32).astype(x.dtype)


def rms_norm_reference(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:  # [M, K]
    """RMSNorm as ``jaxgen.models.llama.RMSNorm`` computes it: ``x / rms(x)`` in float32, cast
    to x's dtype, times ``weight`` ([K], x's dtype); the input the ``norm=`` calls multiply."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return xf.astype(x.dtype) * weight


def rotary_embedding_reference(
    x: jax.Array,  # [T, H, D]
    cos: jax.Array,  # [T, D / 2] float32
    sin: jax.Array,  # [T, D / 2] float32
) -> jax.Array:  # [T, H, D]
    """Rotate-half RoPE in float32 (HF Llama's), cast back to ``x``'s dtype."""
    xf = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    x1, x2 = xf[..., :half], xf[..., half:]
    cos, sin = cos[:, None, :], sin[:, None, :]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def streamed_gated_matmul_reference(
    x: jax.Array,  # [M, K]
    gate: jax.Array,  # [K, N] (a dequantised weight, for the quantised kernel)
    up: jax.Array,  # [K, N]
    activation: str,
) -> jax.Array:  # [M, N], x's dtype
    """``act(x @ gate) * (x @ up)`` as the gated kernels round it (``streamed_matmul.gated``)."""
    gate_product = jnp.dot(x, gate.astype(x.dtype), preferred_element_type=jnp.float32)
    up_product = jnp.dot(x, up.astype(x.dtype), preferred_element_type=jnp.float32)
    return gated(gate_product, up_product, activation, x.dtype)
