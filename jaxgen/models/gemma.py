"""Gemma 2 and Gemma 3 (text) decoder blocks.

Both: Gemma's ``(1 + weight)`` RMSNorm, four norms per block (before and after attention, before
and after the MLP), a tanh-GELU gated MLP, the query scale ``query_pre_attn_scalar ** -0.5``,
sliding-window attention on the layers ``layer_types`` marks, and embeddings scaled by
``sqrt(hidden_size)`` (in ``CausalLM``). Gemma 2 adds attention-logit and final-logit soft
capping; Gemma 3 adds q/k norms and a RoPE base of its own on sliding layers (``CausalLM`` picks
the rotation per layer).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jaxgen.config import ModelConfig
from jaxgen.layers.linear import zeros_initializer
from jaxgen.models.llama import Attention
from jaxgen.models.mlp import MLP


class GemmaRMSNorm(nnx.Module):
    """``x / rms(x) * (1 + weight)``, all in float32 (HF Gemma's order), weights start at 0."""

    def __init__(self, dim: int, eps: float, *, dtype, rngs: nnx.Rngs):
        self.weight = nnx.Param(zeros_initializer(rngs)(None, (dim,), dtype))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return (xf * (1.0 + self.weight[...].astype(jnp.float32))).astype(x.dtype)


class GemmaDecoderLayer(nnx.Module):
    """``x + post_attn_norm(attn(pre_attn_norm(x)))``, then the same around the MLP."""

    def __init__(self, config: ModelConfig, layer: int, *, dtype, rngs: nnx.Rngs):
        norm = functools.partial(
            GemmaRMSNorm, config.hidden_size, config.rms_norm_eps, dtype=dtype, rngs=rngs
        )
        self.input_layernorm = norm()
        self.self_attn = Attention(config, layer, dtype=dtype, rngs=rngs, norm=GemmaRMSNorm)
        self.post_attention_layernorm = norm()
        self.pre_feedforward_layernorm = norm()
        self.mlp = MLP(config, dtype=dtype, rngs=rngs)
        self.post_feedforward_layernorm = norm()

    def __call__(self, x, rope, kv_layer, md, backend):
        attn, kv_layer = self.self_attn(self.input_layernorm(x), rope, kv_layer, md, backend)
        x = x + self.post_attention_layernorm(attn)
        mlp = self.mlp(self.pre_feedforward_layernorm(x), md.live_rows)
        x = x + self.post_feedforward_layernorm(mlp)
        return x, kv_layer
