"""Falcon decoder block: LayerNorms with bias, a GELU MLP, attention and MLP in parallel.

Falcon-7B (multi-query: one KV head) and Falcon-40B/180B (the "new decoder architecture":
grouped KV heads, two LayerNorms ``ln_attn``/``ln_mlp``) keep Q, K and V in one fused
``query_key_value`` tensor; the loader splits it into ``q_proj``/``k_proj``/``v_proj``
(``jaxgen.models.weights``), so attention is the shared ``Attention``. Parallel blocks compute
``x + attn(ln(x)) + mlp(ln'(x))`` (``ln' = ln`` with one norm); sequential ones (``parallel_attn``
false) ``x' = x + attn(ln(x))``, then ``x' + mlp(ln2(x'))``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxgen.config import ModelConfig
from jaxgen.layers.linear import Linear, ones_initializer, zeros_initializer
from jaxgen.models.llama import Attention


class LayerNorm(nnx.Module):
    """``(x - mean) / std * weight + bias`` in float32 (torch ``nn.LayerNorm``; ``bias``
    False: no bias, as ModernBERT's ``norm_bias``)."""

    def __init__(self, dim: int, eps: float, *, dtype, rngs: nnx.Rngs, bias: bool = True):
        self.weight = nnx.Param(ones_initializer(rngs)(None, (dim,), dtype))
        self.bias = nnx.Param(zeros_initializer(rngs)(None, (dim,), dtype)) if bias else None
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        mean = jnp.mean(xf, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
        out = (xf - mean) * jax.lax.rsqrt(var + self.eps) * self.weight[...]
        return (out if self.bias is None else out + self.bias[...]).astype(x.dtype)


class FeedForward(nnx.Module):
    """``down(gelu(up(x)))`` (Falcon's ``dense_h_to_4h`` / ``dense_4h_to_h``)."""

    def __init__(self, config: ModelConfig, *, dtype, rngs: nnx.Rngs):
        d, f, b = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.up_proj = Linear(d, f, bias=b, dtype=dtype, rngs=rngs)
        self.down_proj = Linear(f, d, bias=b, dtype=dtype, rngs=rngs)

    def __call__(self, x, live_rows=None):
        hidden = jax.nn.gelu(self.up_proj(x, live_rows), approximate=False)
        return self.down_proj(hidden, live_rows)


class FalconDecoderLayer(nnx.Module):
    def __init__(self, config: ModelConfig, layer: int, *, dtype, rngs: nnx.Rngs):
        d, eps = config.hidden_size, config.rms_norm_eps
        self.parallel = config.parallel_attention
        self.input_layernorm = LayerNorm(d, eps, dtype=dtype, rngs=rngs)
        self.self_attn = Attention(config, layer, dtype=dtype, rngs=rngs)
        self.mlp = FeedForward(config, dtype=dtype, rngs=rngs)
        # The MLP's own norm: ln_mlp (two parallel norms) or the sequential block's second one.
        if not self.parallel or config.num_parallel_norms == 2:
            self.mlp_layernorm = LayerNorm(d, eps, dtype=dtype, rngs=rngs)
        else:
            self.mlp_layernorm = None

    def __call__(self, x, rope, kv_layer, md, backend):
        normed = self.input_layernorm(x)
        attn, kv_layer = self.self_attn(normed, rope, kv_layer, md, backend)
        if not self.parallel:
            x = x + attn
            return x + self.mlp(self.mlp_layernorm(x), md.live_rows), kv_layer
        mlp_in = normed if self.mlp_layernorm is None else self.mlp_layernorm(x)
        return x + (self.mlp(mlp_in, md.live_rows) + attn), kv_layer
