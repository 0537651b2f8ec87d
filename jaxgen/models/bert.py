"""The BERT-family encoder (BERT, RoBERTa, XLM-RoBERTa): embeddings, post-LayerNorm blocks with
bidirectional attention, and the sequence-classifier heads of cross-encoders.

``x = LN(word + position + token_type)``, then per layer ``x = LN(x + attn(x))``,
``x = LN(x + down(gelu(up(x))))``. Attention goes through the backend it is handed, as the
decoders' does (``jaxgen.backends.DenseBackend(causal=False)``: each row sees every real row
of its sequence). The heads: BERT's ``classifier(tanh(pooler(x[CLS])))``, RoBERTa's
``out_proj(tanh(dense(x[<s>])))``. Parameter names follow the decoders' where the part is the
same (``q_proj``, ``o_proj``, ``up_proj``, ``down_proj``), so a backend's prepared weights and
the loader (``jaxgen.models.bert_weights``) read them alike.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxgen.config.encoder_config import EncoderConfig
from jaxgen.layers.attention import AttentionMetadata
from jaxgen.layers.linear import Embedding, Linear, apply_linears, embedding_table
from jaxgen.models.falcon import LayerNorm

ACTIVATIONS = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
}


def _linear(n_in: int, n_out: int, dtype, rngs) -> Linear:
    return Linear(n_in, n_out, bias=True, dtype=dtype, rngs=rngs)


class EncoderLayer(nnx.Module):
    """``LN(x + attn(x))``, then ``LN(x + mlp(x))``."""

    def __init__(self, config: EncoderConfig, *, dtype, rngs: nnx.Rngs):
        d, f, eps = config.hidden_size, config.intermediate_size, config.layer_norm_eps
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.q_proj = _linear(d, d, dtype, rngs)
        self.k_proj = _linear(d, d, dtype, rngs)
        self.v_proj = _linear(d, d, dtype, rngs)
        self.o_proj = _linear(d, d, dtype, rngs)
        self.attention_norm = LayerNorm(d, eps, dtype=dtype, rngs=rngs)
        self.up_proj = _linear(d, f, dtype, rngs)
        self.down_proj = _linear(f, d, dtype, rngs)
        self.mlp_norm = LayerNorm(d, eps, dtype=dtype, rngs=rngs)
        self.activation = config.hidden_act

    def __call__(self, x, md: AttentionMetadata, backend):
        rows = x.shape[0]
        q, k, v = apply_linears((self.q_proj, self.k_proj, self.v_proj), x, md.live_rows)
        shape = (rows, self.num_heads, self.head_dim)
        out, _ = backend.attention(
            q.reshape(shape),
            k.reshape(shape),
            v.reshape(shape),
            None,
            md,
            scale=self.head_dim**-0.5,
        )
        x = self.attention_norm(x + self.o_proj(out.reshape(rows, -1), md.live_rows))
        hidden = ACTIVATIONS[self.activation](self.up_proj(x, md.live_rows))
        return self.mlp_norm(x + self.down_proj(hidden, md.live_rows))


class BertModel(nnx.Module):
    """The encoder over a pooling step's flat rows, and its classifier head when the config
    has labels."""

    def __init__(self, config: EncoderConfig, *, dtype=jnp.float32, rngs: nnx.Rngs):
        self.config = config
        d = config.hidden_size

        def table(rows: int) -> Embedding:
            return embedding_table(rows, d, dtype=dtype, rngs=rngs)

        self.embed_tokens = table(config.vocab_size)
        self.position_embeddings = table(config.max_position_embeddings)
        self.token_type_embeddings = table(config.type_vocab_size)
        self.embed_norm = LayerNorm(d, config.layer_norm_eps, dtype=dtype, rngs=rngs)
        self.layers = nnx.List(
            [EncoderLayer(config, dtype=dtype, rngs=rngs) for _ in range(config.num_layers)]
        )
        labels = config.num_labels
        bert_head = labels and config.classifier == "pooler"
        self.pooler = _linear(d, d, dtype, rngs) if config.has_pooler or bert_head else None
        self.classifier = _linear(d, labels, dtype, rngs) if bert_head else None
        dense_head = labels and config.classifier == "dense"
        self.classifier_dense = _linear(d, d, dtype, rngs) if dense_head else None
        self.classifier_out = _linear(d, labels, dtype, rngs) if dense_head else None

    def __call__(
        self,
        token_ids: jax.Array,  # [T]
        token_type_ids: jax.Array,  # [T]
        positions: jax.Array,  # [T], from 0 in each sequence
        md: AttentionMetadata,
        *,
        backend,  # a jaxgen.backends.KernelBackend attending within the step
    ) -> jax.Array:  # hidden [T, D]
        x = (
            self.embed_tokens(token_ids)
            + self.position_embeddings(positions + self.config.position_offset)
            + self.token_type_embeddings(token_type_ids)
        )
        x = self.embed_norm(x)
        for layer in self.layers:
            x = layer(x, md, backend)
        return x

    def classify(self, first: jax.Array) -> jax.Array:  # [S, D] (each [CLS] row) -> [S, C]
        """The sequence classifier's logits (float32) from each sequence's first row."""
        if self.classifier is not None:
            return self.classifier(jnp.tanh(self.pooler(first))).astype(jnp.float32)
        if self.classifier_out is None:
            raise ValueError("this encoder has no sequence classifier (num_labels 0)")
        return self.classifier_out(jnp.tanh(self.classifier_dense(first))).astype(jnp.float32)
