"""Logits for every position of one token sequence (parity checks against HF, tests, scoring), and
the same forward pass as a function of the parameters, for a trainer's loss (docs/rl.md)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxgen.backends import select_backend
from jaxgen.layers.attention import AttentionMetadata


def _one_sequence(loaded, num_tokens: int, page_size: int, backend: str):
    """The backend, a private page pool and the metadata of one prefill of ``num_tokens``."""
    cfg = loaded.config
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
    return attention_backend, kv, positions, md


def full_sequence_logits(
    loaded,
    token_ids: list[int],
    *,
    page_size: int = 16,
    backend: str = "reference",
) -> np.ndarray:
    """Runs one prefill over ``token_ids`` in a private page pool; returns ``[T, V]`` float32."""
    attention_backend, kv, positions, md = _one_sequence(loaded, len(token_ids), page_size, backend)

    @jax.jit
    def run(params, kv, ids, pos, md):
        model = nnx.merge(loaded.graphdef, params)
        hidden, _ = model(ids, pos, kv, md, backend=attention_backend)
        return model.compute_logits(hidden)

    return np.asarray(run(loaded.params, kv, np.asarray(token_ids, np.int32), positions, md))


def sequence_logits_fn(loaded, num_tokens: int, *, page_size: int = 16):
    """``logits(token_ids, *states)``: the ``[T, V]`` logits of one sequence of ``num_tokens``
    (``token_ids`` [T] int32) under the parameters ``states`` hold together (``loaded.params``,
    or a trainer's ``nnx.Param`` state beside the rest), a pure jax function on the reference
    backend, so a trainer can ``jax.grad`` a loss through it."""
    attention_backend, kv, positions, md = _one_sequence(loaded, num_tokens, page_size, "reference")
    positions, md = jnp.asarray(positions), jax.tree.map(jnp.asarray, md)  # traced with them
    graphdef = loaded.graphdef

    def logits(token_ids, *states):
        model = nnx.merge(graphdef, *states)
        hidden, _ = model(token_ids, positions, kv, md, backend=attention_backend)
        return model.compute_logits(hidden)

    return logits
