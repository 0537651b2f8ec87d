"""The step's attention metadata (``AttentionMetadata``, one ragged type for every step).

A step runs a flat batch of ``T`` tokens laid out ragged: the rows of sequence ``s`` are
``cu_q_lens[s]:cu_q_lens[s + 1]`` (decode sequences first, one row each, then prefill chunks),
query ``j`` of ``s`` sits at position ``kv_lens[s] - q_len[s] + j`` and attends causally to its
sequence's cache; rows past ``cu_q_lens[num_seqs]`` are bucket padding. New K/V are written into
the pool through ``slot_mapping`` (slot = page * page_size + offset; page 0 is a scratch page
that padding writes into), then attention reads the pool. How the pool is laid out and which
kernels read it is the backend's business (``jaxgen.backends``): a model only calls its
backend's ``attention`` (``KernelBackend.attention``, the one entry point), and a backend
derives any other view of the step from this one.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionMetadata:
    """Device arrays describing where each token of a step reads and writes the KV pool."""

    slot_mapping: jax.Array  # [T] int32
    cu_q_lens: jax.Array  # [S + 1] int32; entries past num_seqs repeat the last real one
    kv_lens: jax.Array  # [S] int32, cached tokens incl. this step's; 0 for unused slots
    block_tables: jax.Array  # [S, W] int32
    num_seqs: jax.Array  # [1] int32, sequences in use
    # [2, 2] int32 [begin, end) of the real decode rows and of the real prefill rows; the rest is
    # bucket padding, which the native CPU matmul skips. None: every row is real.
    live_rows: jax.Array | None = None
    # [S] bool: LongRoPE sequences whose K/V are rotated with the long factors (the engine
    # decides per sequence, see the scheduler). None: those holding more than the original
    # context after this step, right for a whole-sequence forward.
    long_rope: jax.Array | None = None
    # [T] int32: each token row's LoRA slot, -1 for none (``jaxgen.layers.lora``; not attention's,
    # but the step's per-row metadata travels here). None: the engine serves no adapters.
    lora_slots: jax.Array | None = None
    # Static (part of the jitted step's signature): every sequence slot holds at most one row
    # and the step has one row per slot (T == S), as the engine's decode steps do when its
    # backend asks for them marked (``KernelBackend.marks_decode_only_steps``); a backend may
    # then leave its prefill path out of the step.
    decode_only: bool = dataclasses.field(default=False, metadata=dict(static=True))


def row_sequences(md: AttentionMetadata, num_tokens: int):
    """Per token row: its sequence slot ``[T]``, its position ``[T]`` and whether it is real."""
    rows = jnp.arange(num_tokens, dtype=jnp.int32)
    max_seqs = md.kv_lens.shape[0]
    seq = jnp.clip(jnp.searchsorted(md.cu_q_lens[1:], rows, side="right"), 0, max_seqs - 1)
    real = (rows < md.cu_q_lens[jnp.clip(md.num_seqs[0], 0, max_seqs)]) & (seq < md.num_seqs[0])
    q_len = md.cu_q_lens[seq + 1] - md.cu_q_lens[seq]
    position = md.kv_lens[seq] - q_len + rows - md.cu_q_lens[seq]
    return seq, position, real
