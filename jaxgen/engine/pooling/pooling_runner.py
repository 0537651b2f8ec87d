"""The pooling step: one jitted forward over a padded batch of whole sequences, no KV pool.

A batch is ``token_ids`` [S, L] (each sequence's tokens from row 0, right-padded), with
``lengths`` [S] (0 for a padding slot); the model runs on its ``S * L`` rows flat, as a
generation step's, with a ``DenseBackend`` attending within each sequence, and the step
returns one pooled vector [S, D] (or a classifier's logits [S, C], from the rows its
``classifier_pooling`` pools: the first, or the mean) per sequence. Nothing
outlives the call: no pages are allocated, written or kept. Executables are keyed by the
batch's shape alone, so their count is bounded by the engine's (S, L) buckets.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxgen.backends.dense import DenseBackend
from jaxgen.config.encoder_config import EncoderConfig
from jaxgen.engine.pooling.pooling import pool
from jaxgen.layers.attention import AttentionMetadata


def dense_metadata(lengths: jax.Array, length: int) -> AttentionMetadata:
    """The metadata of ``S`` sequences of ``length`` rows each (``lengths`` [S] real rows):
    what the models read of it (``kv_lens``, ``cu_q_lens`` for LongRoPE's choice, the live
    rows: every slot up to the last one in use, so padding slots are skipped by kernels that
    skip rows)."""
    num_seqs = lengths.shape[0]
    used = jnp.sum(lengths > 0).astype(jnp.int32)
    live = jnp.stack([jnp.zeros(2, jnp.int32), jnp.stack([0, used * length])]).astype(jnp.int32)
    return AttentionMetadata(
        slot_mapping=jnp.zeros(num_seqs * length, jnp.int32),
        cu_q_lens=jnp.arange(num_seqs + 1, dtype=jnp.int32) * length,
        kv_lens=lengths,
        block_tables=jnp.zeros((num_seqs, 1), jnp.int32),
        num_seqs=used[None],
        live_rows=live,
    )


@functools.lru_cache(maxsize=16)
def jitted_pooling_step(
    graphdef, backend: DenseBackend, pooling_type: str, classify: bool, encoder: bool
):
    """The pooling step of one model graph, backend and head (see the module docstring);
    ``encoder``: a ``BertModel`` or ``ModernBertModel`` (else a decoder)."""

    def step(params, token_ids, token_type_ids, lengths):  # [S, L], [S, L], [S]
        num_seqs, length = token_ids.shape
        model = nnx.merge(graphdef, params)
        md = dense_metadata(lengths, length)
        positions = jnp.tile(jnp.arange(length, dtype=jnp.int32), num_seqs)
        flat = token_ids.reshape(-1)
        if encoder:
            hidden = model(flat, token_type_ids.reshape(-1), positions, md, backend=backend)
        else:  # a decoder: its final hidden states (before the LM head), with no pool
            hidden, _ = model(flat, positions, [None] * len(model.layers), md, backend=backend)
        pooled = pool(hidden, lengths, pooling_type)
        return model.classify(pooled.astype(hidden.dtype)) if classify else pooled

    return jax.jit(step)


class PoolingRunner:
    """Owns the step's parameters (in the backend's prepared form) and runs batches.

    Args:
        graphdef, params: the model (a ``CausalLM``, a ``BertModel`` or a ``ModernBertModel``).
        config: its config (``ModelConfig`` or ``EncoderConfig``).
        backend: the engine's backend; its prepared weights and RoPE serve the step, its pool
            is never used.
        pooling_type: ``PoolerConfig.pooling_type``; ``classify``: return the sequence
            classifier's logits instead (an encoder with labels, over the rows its config's
            ``classifier_pooling`` pools).
    """

    def __init__(self, graphdef, params, config, backend, *, pooling_type: str, classify: bool):
        encoder = isinstance(config, EncoderConfig)
        dense = DenseBackend(causal=not encoder, base=backend)
        # A pooling step has no LM head: a tied embedding is not prepared as one.
        plain = dataclasses.replace(config, tie_word_embeddings=False)
        self.params, _ = dense.prepare_params(params, plain)
        if classify:
            pooling_type = config.classifier_pooling
        self._step = jitted_pooling_step(graphdef, dense, pooling_type, classify, encoder)
        self.shapes: set[tuple[int, int]] = set()  # the (S, L) shapes run: one executable each

    def run(self, token_ids: np.ndarray, token_type_ids: np.ndarray, lengths: np.ndarray):
        """``[S, L]`` int32 tokens and token types, ``[S]`` lengths -> ``[S, D or C]`` float32."""
        self.shapes.add(token_ids.shape)
        out = self._step(self.params, token_ids, token_type_ids, lengths)
        return np.asarray(out)
