"""The step's attention metadata and the one attention entry point models call.

A step runs a flat batch of ``T`` tokens: the first ``Bd`` rows are decode tokens (one per
sequence), the remaining ``Tp`` rows are prefill chunks laid end to end. New K/V are written into
the pool through ``slot_mapping`` (slot = page * page_size + offset; page 0 is a scratch page that
padding writes into), then attention reads the pool. How the pool is laid out and which kernels
read it is the backend's business (``jaxgen.backends``); a model only calls :func:`attention`.
"""

from __future__ import annotations

import dataclasses

import jax


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
    # Prefill, ragged: sequences' chunks end to end (the Pallas kernels).
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


def attention(
    q: jax.Array,  # [T, Hq, D]
    k: jax.Array,  # [T, Hkv, D], this step's keys (RoPE applied)
    v: jax.Array,  # [T, Hkv, D]
    kv_layer,  # this layer's slice of the pool, in the backend's layout
    md: AttentionMetadata,
    *,
    backend,  # a jaxgen.backends.AttentionBackend
    scale: float,
    soft_cap: float | None = None,
    sliding_window: int | None = None,
):  # -> ([T, Hq, D], kv_layer)
    """Writes the step's K/V into the pool, then attends every token to its sequence's cache."""
    return backend.attention(
        q, k, v, kv_layer, md, scale=scale, soft_cap=soft_cap, sliding_window=sliding_window
    )
