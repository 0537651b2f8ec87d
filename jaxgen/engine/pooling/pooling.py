"""Pooling a step's hidden rows into one vector per sequence (on the device), and what a
request's ``PoolingParams`` do to it afterwards (on the host: truncation, normalisation, a
classifier's activation)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def pool(
    hidden: jax.Array,  # [S * L, D]
    lengths: jax.Array,  # [S] int32, real rows of each sequence (0: a padding slot)
    pooling_type: str,
) -> jax.Array:  # [S, D] float32
    """LAST: each sequence's last real row; MEAN: the mean of its real rows; CLS: its first."""
    num_seqs = lengths.shape[0]
    rows = hidden.reshape(num_seqs, -1, hidden.shape[-1]).astype(jnp.float32)
    if pooling_type == "CLS":
        return rows[:, 0]
    if pooling_type == "LAST":
        last = jnp.maximum(lengths - 1, 0)
        return jnp.take_along_axis(rows, last[:, None, None], axis=1)[:, 0]
    if pooling_type == "MEAN":
        real = jnp.arange(rows.shape[1])[None, :] < lengths[:, None]  # [S, L]
        total = jnp.sum(jnp.where(real[..., None], rows, 0.0), axis=1)
        return total / jnp.maximum(lengths, 1)[:, None].astype(jnp.float32)
    raise ValueError(f"unknown pooling_type {pooling_type!r}")


def finish_embedding(vector: np.ndarray, *, dimensions: int | None, normalize: bool) -> np.ndarray:
    """The first ``dimensions`` entries (all: None), then scaled to unit length when
    ``normalize`` (torch's ``F.normalize``: divided by ``max(norm, 1e-12)``)."""
    if dimensions is not None:
        vector = vector[:dimensions]
    if normalize:
        vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
    return vector


def class_probabilities(logits: np.ndarray) -> np.ndarray:
    """A classifier's probabilities: softmax over its labels, sigmoid of a single logit (as
    sentence-transformers' CrossEncoder and vLLM score a one-label cross-encoder)."""
    logits = logits.astype(np.float64)
    if logits.shape[-1] == 1:
        return (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (shifted / shifted.sum(axis=-1, keepdims=True)).astype(np.float32)
