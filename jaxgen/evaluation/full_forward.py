"""Logits for every position of one token sequence (parity checks against HF, tests, scoring)."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from jaxgen.backends import select_backend
from jaxgen.layers.attention import AttentionMetadata


def full_sequence_logits(
    loaded,
    token_ids: list[int],
    *,
    page_size: int = 16,
    backend: str = "reference",
) -> np.ndarray:
    """Runs one prefill over ``token_ids`` in a private page pool; returns ``[T, V]`` float32."""
    cfg = loaded.config
    num_tokens = len(token_ids)
    num_pages = -(-num_tokens // page_size)
    attention_backend = select_backend(backend, dtype=loaded.dtype)
    kv = attention_backend.allocate_kv_pool(cfg, num_pages + 1, page_size, loaded.dtype)
    table = np.arange(1, num_pages + 1, dtype=np.int32)[None, :]
    positions = np.arange(num_tokens, dtype=np.int32)
    md = AttentionMetadata(
        slot_mapping=positions + page_size,
        cu_q_lens=np.array([0, num_tokens], np.int32),
        kv_lens=np.array([num_tokens], np.int32),
        block_tables=table,
        num_seqs=np.array([1], np.int32),
    )

    @jax.jit
    def run(params, kv, ids, pos, md):
        model = nnx.merge(loaded.graphdef, params)
        hidden, _ = model(ids, pos, kv, md, backend=attention_backend)
        return model.compute_logits(hidden)

    return np.asarray(run(loaded.params, kv, np.asarray(token_ids, np.int32), positions, md))
