"""Attention over the paged KV pool: metadata for one engine step and the backends that use it.

A step runs a flat batch of ``T`` tokens: the first ``Bd`` rows are decode tokens (one per
sequence), the remaining ``Tp`` rows are prefill chunks laid end to end. New K/V are written into
the pool through ``slot_mapping`` (slot = page * page_size + offset; page 0 is a scratch page that
padding writes into), then attention reads the pool.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from pallas_kernels import paged_attention_reference
from pallas_kernels.paged_attention import MASK_VALUE, gather_pages
from pallas_kernels.paged_attention_cpu import cpu_kernel_available, paged_attention_cpu

BACKENDS = ("reference", "pallas", "cpu", "auto")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionMetadata:
    """Device arrays describing where each token of a step reads and writes the KV pool."""

    slot_mapping: jax.Array  # [T] int32
    decode_lengths: jax.Array  # [Bd] int32, cached tokens incl. the new one; 0 for padding rows
    decode_block_tables: jax.Array  # [Bd, Wd] int32
    # Prefill, blocked for the XLA path: each block holds up to Bq query rows of one sequence.
    prefill_query_index: jax.Array  # [Nb, Bq] int32 into prefill rows; Tp means padding
    prefill_query_positions: jax.Array  # [Nb, Bq] int32, -1 for padding
    prefill_block_tables: jax.Array  # [Nb, Wp] int32
    # Prefill, ragged for the Pallas kernel.
    prefill_cu_q_lens: jax.Array  # [Sp + 1] int32
    prefill_kv_lens: jax.Array  # [Sp] int32
    prefill_seq_block_tables: jax.Array  # [Sp, Wp] int32
    prefill_num_seqs: jax.Array  # [1] int32
    # [2, 2] int32 [begin, end) of the real decode rows and of the real prefill rows; the rest is
    # bucket padding, which the native CPU matmul skips. None: every row is real.
    live_rows: jax.Array | None = None

    @property
    def num_decode(self) -> int:
        return self.decode_lengths.shape[0]


def resolve_backend(backend: str, *, dtype=jnp.float32, sharded: bool = False) -> str:
    """Maps ``"auto"`` to ``"pallas"`` on GPU/TPU; on CPU to ``"cpu"`` (the native decode kernel)
    when the KV pool is float32, unsharded and the kernel builds, else to ``"reference"``."""
    if backend not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {BACKENDS}, got {backend!r}")
    on_cpu = jax.default_backend() == "cpu"
    if backend == "auto":
        if not on_cpu:
            return "pallas"
        usable = jnp.dtype(dtype) == jnp.float32 and not sharded and cpu_kernel_available()
        return "cpu" if usable else "reference"
    if backend == "cpu":
        if not on_cpu:
            raise ValueError("attention_backend='cpu' runs only on the CPU backend")
        if jnp.dtype(dtype) != jnp.float32:
            raise ValueError(f"attention_backend='cpu' needs dtype float32, got {jnp.dtype(dtype)}")
        if sharded:
            raise ValueError("attention_backend='cpu' does not support tensor parallelism")
        if not cpu_kernel_available():
            raise ValueError("attention_backend='cpu': the kernel could not be built here")
    return backend


def write_kv(
    k_pages: jax.Array,  # [Hkv, P, S, D]
    v_pages: jax.Array,  # [Hkv, P, S, D]
    k: jax.Array,  # [T, Hkv, D]
    v: jax.Array,  # [T, Hkv, D]
    slot_mapping: jax.Array,  # [T]
) -> tuple[jax.Array, jax.Array]:
    """Scatters new keys and values into their slots (in place when the pool is donated)."""
    hkv, pages, page_size, dim = k_pages.shape
    k_flat = (
        k_pages.reshape(hkv, pages * page_size, dim)
        .at[:, slot_mapping]
        .set(k.swapaxes(0, 1).astype(k_pages.dtype), unique_indices=False)
    )
    v_flat = (
        v_pages.reshape(hkv, pages * page_size, dim)
        .at[:, slot_mapping]
        .set(v.swapaxes(0, 1).astype(v_pages.dtype), unique_indices=False)
    )
    return k_flat.reshape(k_pages.shape), v_flat.reshape(v_pages.shape)


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


def paged_attention_step(
    q: jax.Array,  # [T, Hq, D]
    k_pages: jax.Array,
    v_pages: jax.Array,
    md: AttentionMetadata,
    *,
    backend: str,
    scale: float,
    soft_cap: float | None = None,
    sliding_window: int | None = None,
) -> jax.Array:  # [T, Hq, D]
    """Attention for every token of a step: decode rows, then prefill rows."""
    num_decode = md.num_decode
    outputs = []
    opts = dict(scale=scale, soft_cap=soft_cap, sliding_window=sliding_window)
    if num_decode:
        q_dec = q[:num_decode]
        if backend == "pallas":
            from pallas_kernels import paged_attention

            out = paged_attention(
                q_dec,
                k_pages,
                v_pages,
                md.decode_lengths,
                md.decode_block_tables,
                interpret=jax.default_backend() == "cpu",
                **opts,
            )
        elif backend == "cpu":
            out = paged_attention_cpu(
                q_dec, k_pages, v_pages, md.decode_lengths, md.decode_block_tables, **opts
            )
        else:
            out = paged_attention_reference(
                q_dec, k_pages, v_pages, md.decode_lengths, md.decode_block_tables, **opts
            )
        outputs.append(out)
    if q.shape[0] > num_decode:
        q_pre = q[num_decode:]
        if backend == "pallas":
            from pallas_kernels import ragged_paged_attention

            out = ragged_paged_attention(
                q_pre,
                k_pages,
                v_pages,
                md.prefill_kv_lens,
                md.prefill_seq_block_tables,
                md.prefill_cu_q_lens,
                md.prefill_num_seqs,
                interpret=jax.default_backend() == "cpu",
                **opts,
            )
        else:
            out = blocked_prefill_attention(
                q_pre,
                k_pages,
                v_pages,
                md.prefill_query_index,
                md.prefill_query_positions,
                md.prefill_block_tables,
                **opts,
            )
        outputs.append(out)
    return outputs[0] if len(outputs) == 1 else jnp.concatenate(outputs, axis=0)
