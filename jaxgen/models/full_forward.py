"""Logits for every position of one token sequence (parity checks against HF, tests, scoring)."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from jaxgen.attention import AttentionMetadata
from jaxgen.backends import select_backend


def full_sequence_logits(
    loaded,
    token_ids: list[int],
    *,
    page_size: int = 16,
    backend: str = "reference",
    query_block: int = 16,
) -> np.ndarray:
    """Runs one prefill over ``token_ids`` in a private page pool; returns ``[T, V]`` float32."""
    cfg = loaded.config
    num_tokens = len(token_ids)
    num_pages = -(-num_tokens // page_size)
    attention_backend = select_backend(backend, dtype=loaded.dtype)
    kv = attention_backend.allocate_kv_pool(cfg, num_pages + 1, page_size, loaded.dtype)
    table = np.arange(1, num_pages + 1, dtype=np.int32)[None, :]
    positions = np.arange(num_tokens, dtype=np.int32)
    num_blocks = -(-num_tokens // query_block)
    q_index = np.full((num_blocks, query_block), num_tokens, np.int32)
    q_pos = np.full((num_blocks, query_block), -1, np.int32)
    for b in range(num_blocks):
        n = min(query_block, num_tokens - b * query_block)
        q_index[b, :n] = positions[b * query_block : b * query_block + n]
        q_pos[b, :n] = q_index[b, :n]
    md = AttentionMetadata(
        slot_mapping=positions + page_size,
        decode_lengths=np.zeros(0, np.int32),
        decode_block_tables=np.zeros((0, num_pages), np.int32),
        prefill_query_index=q_index,
        prefill_query_positions=q_pos,
        prefill_block_tables=np.repeat(table, num_blocks, axis=0),
        prefill_cu_q_lens=np.array([0, num_tokens], np.int32),
        prefill_kv_lens=np.array([num_tokens], np.int32),
        prefill_seq_block_tables=table,
        prefill_num_seqs=np.array([1], np.int32),
    )

    @jax.jit
    def run(params, kv, ids, pos, md):
        model = nnx.merge(loaded.graphdef, params)
        hidden, _ = model(ids, pos, kv, md, backend=attention_backend)
        return model.compute_logits(hidden)

    return np.asarray(run(loaded.params, kv, np.asarray(token_ids, np.int32), positions, md))
