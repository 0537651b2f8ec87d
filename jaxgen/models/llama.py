"""The pre-norm decoder block of the Llama family, and the pieces other families reuse.

Llama 2/3, Mistral, SmolLM2, Qwen2, Qwen3 (q/k norms, per-layer sliding window), Phi-3 (its
fused ``qkv_proj``/``gate_up_proj`` are split at load) and the mixture-of-experts Mixtral and
Qwen3-MoE (``jaxgen.models.moe.SparseMoE`` in place of the gated MLP of ``jaxgen.models.mlp``)
all run this block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``. Parameter names follow
Hugging Face's so loaders map them 1:1. The decoder stack around the blocks is
``jaxgen.models.causal_lm``.
"""

from __future__ import annotations

import jax
from flax import nnx

from jaxgen.config import ModelConfig
from jaxgen.layers.linear import Linear, NormedInput, apply_linears, ones_initializer, rms_norm
from jaxgen.models.mlp import MLP
from jaxgen.models.moe import SparseMoE


class RMSNorm(nnx.Module):
    """``x / rms(x) * weight`` (computed in float32, scaled in the input's dtype, as HF Llama)."""

    def __init__(self, dim: int, eps: float, *, dtype, rngs: nnx.Rngs):
        self.weight = nnx.Param(ones_initializer(rngs)(None, (dim,), dtype))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, self.weight[...], self.eps)

    def deferred(self, x: jax.Array) -> NormedInput:
        """The norm of ``x`` for the linears that read it, which may compute it themselves."""
        return NormedInput(x, self.weight[...], self.eps)


def _linear(n_in: int, n_out: int, bias: bool, dtype, rngs: nnx.Rngs) -> Linear:
    return Linear(n_in, n_out, bias=bias, dtype=dtype, rngs=rngs)


class Attention(nnx.Module):
    """Projections, optional per-head q/k norms, RoPE, and the one attention entry point.

    ``norm``: the norm class of the q/k norms (used when ``config.qk_norm``)."""

    def __init__(self, config: ModelConfig, layer: int, *, dtype, rngs: nnx.Rngs, norm=RMSNorm):
        d, hd = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, hd
        self.sliding_window = config.layer_sliding_window(layer)
        self.scale = config.attention_scale or hd**-0.5
        self.soft_cap = config.attn_logit_softcap
        self.q_proj = _linear(d, config.num_heads * hd, config.qkv_bias, dtype, rngs)
        self.k_proj = _linear(d, config.num_kv_heads * hd, config.qkv_bias, dtype, rngs)
        self.v_proj = _linear(d, config.num_kv_heads * hd, config.qkv_bias, dtype, rngs)
        self.o_proj = _linear(config.num_heads * hd, d, config.o_bias, dtype, rngs)
        if config.qk_norm:
            self.q_norm = norm(hd, config.rms_norm_eps, dtype=dtype, rngs=rngs)
            self.k_norm = norm(hd, config.rms_norm_eps, dtype=dtype, rngs=rngs)
        else:
            self.q_norm = self.k_norm = None

    def __call__(self, x, rope, kv_layer, md, backend):
        tokens, live = x.shape[0], md.live_rows
        q, k, v = apply_linears((self.q_proj, self.k_proj, self.v_proj), x, live)
        q = q.reshape(tokens, self.num_heads, self.head_dim)
        k = k.reshape(tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = backend.rotate(q, rope), backend.rotate(k, rope)
        out, kv_layer = backend.attention(
            q,
            k,
            v,
            kv_layer,
            md,
            scale=self.scale,
            soft_cap=self.soft_cap,
            sliding_window=self.sliding_window,
        )
        return self.o_proj(out.reshape(tokens, -1), live), kv_layer


class DecoderLayer(nnx.Module):
    """``x + attn(norm(x))``, then ``x + mlp(norm(x))``; the MLP is sparse on MoE layers."""

    def __init__(self, config: ModelConfig, layer: int, *, dtype, rngs: nnx.Rngs):
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, dtype=dtype, rngs=rngs)
        self.self_attn = Attention(config, layer, dtype=dtype, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, dtype=dtype, rngs=rngs)
        if config.is_moe_layer(layer):
            self.mlp = SparseMoE(config, dtype=dtype, rngs=rngs)
        else:
            self.mlp = MLP(config, dtype=dtype, rngs=rngs)

    def __call__(self, x, rope, kv_layer, md, backend):
        # The norms are deferred to the projections that read them (``NormedInput``); the
        # sparse MLP's router reads its input as is.
        normed = self.input_layernorm.deferred(x)
        attn, kv_layer = self.self_attn(normed, rope, kv_layer, md, backend)
        x = x + attn
        norm = self.post_attention_layernorm
        x = x + self.mlp(norm.deferred(x) if isinstance(self.mlp, MLP) else norm(x), md.live_rows)
        return x, kv_layer
