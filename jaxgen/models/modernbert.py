"""ModernBERT: a pre-norm encoder with rotary positions and alternating global and local
(sliding-window) attention, and its sequence-classifier head.

``x = LN(embed(ids))``, then per layer ``x = x + attn(LN(x))`` (layer 0 reads the embedding
norm's output as it is) and ``x = x + mlp(LN(x))`` with the GeGLU MLP the decoders share
(``jaxgen.models.mlp.MLP``: ``down(gelu(gate(x)) * up(x))``, the halves of ``Wi``), then
``LN(x)``. Global layers rotate with ``rope_theta`` and see every real row of their sequence;
local ones rotate with ``local_rope_theta`` and see the rows within ``local_attention // 2``
of each row, a bidirectional window the backend applies per sequence
(``jaxgen.backends.DenseBackend(causal=False)`` with ``sliding_window``). The head:
``classifier(LN(act(dense(pooled))))`` over each sequence's first row or the mean of its rows
(``classifier_pooling``). Parameter names follow the decoders'; ``modernbert_weights`` maps
them to transformers' (``Wqkv``, ``Wi`` split at load).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxgen.config.encoder_config import EncoderConfig
from jaxgen.layers.attention import AttentionMetadata
from jaxgen.layers.linear import Linear, apply_linears, embedding_table
from jaxgen.layers.rope import base_frequencies, rope_angles
from jaxgen.models.falcon import LayerNorm
from jaxgen.models.mlp import ACTIVATIONS, MLP


def _norm(config: EncoderConfig, dtype, rngs) -> LayerNorm:
    eps = config.layer_norm_eps
    return LayerNorm(config.hidden_size, eps, dtype=dtype, rngs=rngs, bias=config.norm_bias)


class ModernBertLayer(nnx.Module):
    """``x + attn(LN(x))``, then ``x + mlp(LN(x))``; a local layer attends within its window."""

    def __init__(self, config: EncoderConfig, layer: int, *, dtype, rngs: nnx.Rngs):
        d, bias = config.hidden_size, config.attention_bias
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.local = config.layer_types[layer] == "sliding_attention"
        # The backend's window of W rows reaches W - 1 rows each side of a row.
        self.window = config.local_attention // 2 + 1 if self.local else None
        self.attention_norm = _norm(config, dtype, rngs) if layer else None
        self.q_proj = Linear(d, d, bias=bias, dtype=dtype, rngs=rngs)
        self.k_proj = Linear(d, d, bias=bias, dtype=dtype, rngs=rngs)
        self.v_proj = Linear(d, d, bias=bias, dtype=dtype, rngs=rngs)
        self.o_proj = Linear(d, d, bias=bias, dtype=dtype, rngs=rngs)
        self.mlp_norm = _norm(config, dtype, rngs)
        self.mlp = MLP(config, dtype=dtype, rngs=rngs)

    def __call__(self, x, rope, md: AttentionMetadata, backend):
        rows, live = x.shape[0], md.live_rows
        normed = x if self.attention_norm is None else self.attention_norm(x)
        q, k, v = apply_linears((self.q_proj, self.k_proj, self.v_proj), normed, live)
        shape = (rows, self.num_heads, self.head_dim)
        out, _ = backend.attention(
            backend.rotate(q.reshape(shape), rope),
            backend.rotate(k.reshape(shape), rope),
            v.reshape(shape),
            None,
            md,
            scale=self.head_dim**-0.5,
            sliding_window=self.window,
        )
        x = x + self.o_proj(out.reshape(rows, -1), live)
        return x + self.mlp(self.mlp_norm(x), live)


class ModernBertModel(nnx.Module):
    """The encoder over a pooling step's flat rows, and its classifier head when the config
    has labels."""

    def __init__(self, config: EncoderConfig, *, dtype=jnp.float32, rngs: nnx.Rngs):
        self.config = config
        d = config.hidden_size
        self.embed_tokens = embedding_table(config.vocab_size, d, dtype=dtype, rngs=rngs)
        self.embed_norm = _norm(config, dtype, rngs)
        self.layers = nnx.List(
            [ModernBertLayer(config, i, dtype=dtype, rngs=rngs) for i in range(config.num_layers)]
        )
        self.final_norm = _norm(config, dtype, rngs)
        labels = config.num_labels
        bias = config.classifier_bias
        self.head_dense = Linear(d, d, bias=bias, dtype=dtype, rngs=rngs) if labels else None
        self.head_norm = _norm(config, dtype, rngs) if labels else None
        self.classifier = Linear(d, labels, bias=True, dtype=dtype, rngs=rngs) if labels else None

    def rotations(self, positions: jax.Array):  # [T] -> (global, local) cos, sin
        """The step's RoPE of the global and of the local layers (from the config's bases:
        constants of the compiled step, not parameters)."""
        c = self.config
        tables = (c.rope_theta, c.local_rope_theta)
        return tuple(
            rope_angles(positions, jnp.asarray(base_frequencies(c.head_dim, theta), jnp.float32))
            for theta in tables
        )

    def __call__(
        self,
        token_ids: jax.Array,  # [T]
        token_type_ids: jax.Array,  # [T]; unused (no token types), the encoders' one signature
        positions: jax.Array,  # [T], from 0 in each sequence
        md: AttentionMetadata,
        *,
        backend,  # a jaxgen.backends.KernelBackend attending within the step
    ) -> jax.Array:  # hidden [T, D]
        x = self.embed_norm(self.embed_tokens(token_ids))
        full, local = self.rotations(positions)
        for layer in self.layers:
            x = layer(x, local if layer.local else full, md, backend)
        return self.final_norm(x)

    def classify(self, pooled: jax.Array) -> jax.Array:  # [S, D] -> [S, C]
        """The sequence classifier's logits (float32) from each sequence's pooled rows."""
        if self.classifier is None:
            raise ValueError("this encoder has no sequence classifier (num_labels 0)")
        hidden = ACTIVATIONS[self.config.classifier_activation](self.head_dense(pooled))
        return self.classifier(self.head_norm(hidden)).astype(jnp.float32)
