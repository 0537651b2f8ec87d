"""Llama-family decoder in Flax NNX (Llama 2/3, Mistral, SmolLM2, Qwen2).

The model knows nothing about batching strategy or parallelism: it takes a flat batch of tokens,
their positions, the per-layer KV pages and the step's attention metadata, and returns hidden
states plus the updated pages. Parameter names follow Hugging Face's so loaders map 1:1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxgen.attention import AttentionMetadata, attention
from jaxgen.config import ModelConfig
from jaxgen.models.linear import Embedding, Linear, apply_linears, matmul
from jaxgen.models.rope import apply_rope, inverse_frequencies, rope_angles

KVCache = list  # per layer: that layer's pool in the backend's layout


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, *, dtype, rngs: nnx.Rngs):
        self.weight = nnx.Param(jnp.ones((dim,), dtype))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return xf.astype(x.dtype) * self.weight[...]


def _linear(n_in: int, n_out: int, bias: bool, dtype, rngs: nnx.Rngs) -> Linear:
    return Linear(n_in, n_out, bias=bias, dtype=dtype, rngs=rngs)


class Attention(nnx.Module):
    def __init__(self, config: ModelConfig, *, dtype, rngs: nnx.Rngs):
        d, hd = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, hd
        self.sliding_window = config.sliding_window
        self.q_proj = _linear(d, config.num_heads * hd, config.qkv_bias, dtype, rngs)
        self.k_proj = _linear(d, config.num_kv_heads * hd, config.qkv_bias, dtype, rngs)
        self.v_proj = _linear(d, config.num_kv_heads * hd, config.qkv_bias, dtype, rngs)
        self.o_proj = _linear(config.num_heads * hd, d, config.o_bias, dtype, rngs)

    def __call__(self, x, rope, kv_layer, md, backend):
        tokens, live = x.shape[0], md.live_rows
        q, k, v = apply_linears((self.q_proj, self.k_proj, self.v_proj), x, live)
        q = q.reshape(tokens, self.num_heads, self.head_dim)
        k = k.reshape(tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(tokens, self.num_kv_heads, self.head_dim)
        q = apply_rope(q, rope)
        k = apply_rope(k, rope)
        out, kv_layer = attention(
            q,
            k,
            v,
            kv_layer,
            md,
            backend=backend,
            scale=self.head_dim**-0.5,
            sliding_window=self.sliding_window,
        )
        return self.o_proj(out.reshape(tokens, -1), live), kv_layer


class MLP(nnx.Module):
    def __init__(self, config: ModelConfig, *, dtype, rngs: nnx.Rngs):
        d, f, b = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = _linear(d, f, b, dtype, rngs)
        self.up_proj = _linear(d, f, b, dtype, rngs)
        self.down_proj = _linear(f, d, b, dtype, rngs)

    def __call__(self, x, live_rows=None):
        gate, up = apply_linears((self.gate_proj, self.up_proj), x, live_rows)
        hidden = jax.nn.silu(gate) * up
        return self.down_proj(hidden, live_rows)


class DecoderLayer(nnx.Module):
    def __init__(self, config: ModelConfig, *, dtype, rngs: nnx.Rngs):
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, dtype=dtype, rngs=rngs)
        self.self_attn = Attention(config, dtype=dtype, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, dtype=dtype, rngs=rngs)
        self.mlp = MLP(config, dtype=dtype, rngs=rngs)

    def __call__(self, x, rope, kv_layer, md, backend):
        attn, kv_layer = self.self_attn(self.input_layernorm(x), rope, kv_layer, md, backend)
        x = x + attn
        x = x + self.mlp(self.post_attention_layernorm(x), md.live_rows)
        return x, kv_layer


class LlamaForCausalLM(nnx.Module):
    """Decoder stack plus LM head (tied to the embedding when the config says so)."""

    def __init__(self, config: ModelConfig, *, dtype=jnp.float32, rngs: nnx.Rngs):
        self.config = config
        self.embed_tokens = Embedding(
            config.vocab_size, config.hidden_size, dtype=dtype, param_dtype=dtype, rngs=rngs
        )
        self.layers = nnx.List(
            [DecoderLayer(config, dtype=dtype, rngs=rngs) for _ in range(config.num_layers)]
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype, rngs=rngs)
        if not config.tie_word_embeddings:
            self.lm_head = _linear(config.hidden_size, config.vocab_size, False, dtype, rngs)
        self.inv_freq = nnx.Variable(jnp.asarray(inverse_frequencies(config)))

    def __call__(
        self,
        token_ids: jax.Array,  # [T]
        positions: jax.Array,  # [T]
        kv_cache: KVCache,
        md: AttentionMetadata,
        *,
        backend,  # a jaxgen.backends.AttentionBackend
    ) -> tuple[jax.Array, KVCache]:  # hidden [T, D], updated pages
        """Runs the decoder stack (layers unrolled: faster than a scan on XLA CPU)."""
        x = self.embed_tokens(token_ids)
        rope = rope_angles(
            positions, self.inv_freq[...]
        )  # traced once; XLA may recompute per layer
        new_cache = []
        for layer, kv_layer in zip(self.layers, kv_cache, strict=True):
            x, kv_layer = layer(x, rope, kv_layer, md, backend)
            new_cache.append(kv_layer)
        return self.norm(x), new_cache

    def compute_logits(
        self,
        hidden: jax.Array,
        *,
        head_kernel=None,
        live_rows: jax.Array | None = None,
    ) -> jax.Array:  # [N, D] -> [N, V] float32
        """LM head; ``head_kernel``: a [D, V] kernel to use instead, in any form ``Linear`` takes
        (the backend's prepared tied embedding, see ``AttentionBackend.prepare_params``);
        ``live_rows``: the rows that are not padding (see ``Linear``)."""
        if head_kernel is not None:
            logits = matmul(hidden, head_kernel, live_rows)
        elif self.config.tie_word_embeddings:
            logits = self.embed_tokens.attend(hidden)
        else:
            logits = self.lm_head(hidden, live_rows)
        return logits.astype(jnp.float32)
