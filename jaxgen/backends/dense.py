"""Attention over whole sequences held in the step, with no KV pool: the pooling forward's
backend (embeddings, scores; ``jaxgen.engine.pooling``).

A pooling step is ``S`` sequences padded to ``L`` rows each, laid out flat (``T = S * L``
rows; ``md.cu_q_lens`` = ``0, L, 2L, ...``), ``md.kv_lens`` their real lengths. Each row
attends to the real rows of its own sequence: causally for a decoder, both ways for an encoder.
A layer's ``sliding_window`` W keeps a row to the keys fewer than W rows from it: the W - 1
before it for a decoder, W - 1 on each side for an encoder (ModernBERT's local layers, whose
window of ``local_attention`` rows is W = ``local_attention // 2 + 1``).
Nothing is written anywhere, so nothing is kept once the step ends. The weights, the
projections and RoPE are those of ``base`` (the engine's backend: on the CPU the native
matmuls over packed panels), whose pool this backend never touches.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxgen.backends.base import KernelBackend
from pallas_kernels.ragged_layout import MASK_VALUE


@dataclasses.dataclass(frozen=True)
class DenseBackend(KernelBackend):
    """``causal``: a row sees the rows before it (decoders); False: every real row of its
    sequence (encoders). ``base``: the backend whose prepared weights and RoPE the step runs
    on (None: plain arrays, ``apply_rope``)."""

    name = "dense"
    causal: bool = True
    base: KernelBackend | None = None

    def prepare_params(self, params, config):
        if self.base is None:
            return params, None
        return self.base.prepare_params(params, config)

    def rotate(self, x, rope):
        return super().rotate(x, rope) if self.base is None else self.base.rotate(x, rope)

    def attention(self, q, k, v, kv_layer, md, *, scale, soft_cap=None, sliding_window=None):
        """``q`` [S * L, Hq, D], ``k``/``v`` [S * L, Hkv, D]; ``kv_layer`` is passed through
        (None). Rows past a sequence's length are padding: they attend to the real rows in
        their reach (zeros where a window leaves them none), and nothing reads them."""
        out = dense_attention(
            q,
            k,
            v,
            md.kv_lens,
            scale=scale,
            causal=self.causal,
            soft_cap=soft_cap,
            sliding_window=sliding_window,
        )
        return out, kv_layer


def dense_attention(
    q: jax.Array,  # [S * L, Hq, D]
    k: jax.Array,  # [S * L, Hkv, D]
    v: jax.Array,  # [S * L, Hkv, D]
    lengths: jax.Array,  # [S] int32
    *,
    scale: float,
    causal: bool,
    soft_cap: float | None = None,
    sliding_window: int | None = None,
) -> jax.Array:  # [S * L, Hq, D]
    """Masked softmax attention within each padded sequence, in float32 (grouped KV heads)."""
    num_seqs = lengths.shape[0]
    rows, num_heads, head_dim = q.shape
    num_kv_heads, length = k.shape[1], rows // num_seqs
    group = num_heads // num_kv_heads
    qs = q.reshape(num_seqs, length, num_kv_heads, group, head_dim).astype(jnp.float32)
    ks = k.reshape(num_seqs, length, num_kv_heads, head_dim).astype(jnp.float32)
    vs = v.reshape(num_seqs, length, num_kv_heads, head_dim).astype(jnp.float32)
    scores = jnp.einsum("sqhgd,skhd->shgqk", qs * scale, ks)
    if soft_cap is not None:
        scores = soft_cap * jnp.tanh(scores / soft_cap)
    key = jnp.arange(length)
    valid = key[None, None, :] < lengths[:, None, None]  # [S, 1, L]: real keys
    query = key[:, None]
    if causal:
        valid = valid & (key[None, :] <= query)[None]  # [S, L, L]
    if sliding_window is not None:  # a window of W rows: up to W - 1 away (before it if causal)
        near = key[None, :] > query - sliding_window
        if not causal:
            near = near & (key[None, :] < query + sliding_window)
        valid = valid & near[None]
    valid = valid[:, None, None]  # [S, 1, 1, Lq or 1, Lk]
    probs = jax.nn.softmax(jnp.where(valid, scores, MASK_VALUE), axis=-1)
    out = jnp.einsum("shgqk,skhd->sqhgd", jnp.where(valid, probs, 0.0), vs)
    return out.reshape(rows, num_heads, head_dim).astype(q.dtype)
