"""The gated MLP every dense family runs (SwiGLU, or Gemma's tanh-GELU GeGLU), and the shared
expert of a mixture-of-experts layer."""

from __future__ import annotations

import jax
from flax import nnx

from jaxgen.config import ModelConfig
from jaxgen.layers.linear import Linear, apply_linears, gated_matmul

ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
}


class MLP(nnx.Module):
    """Gated MLP: ``down(act(gate(x)) * up(x))`` (SwiGLU, or Gemma's tanh-GELU GeGLU)."""

    def __init__(self, config: ModelConfig, *, dtype, rngs: nnx.Rngs, width: int | None = None):
        d, b = config.hidden_size, config.mlp_bias
        f = width or config.intermediate_size
        self.activation_name = config.hidden_act
        self.activation = ACTIVATIONS[config.hidden_act]
        self.gate_proj = Linear(d, f, bias=b, dtype=dtype, rngs=rngs)
        self.up_proj = Linear(d, f, bias=b, dtype=dtype, rngs=rngs)
        self.down_proj = Linear(f, d, bias=b, dtype=dtype, rngs=rngs)

    def __call__(self, x, live_rows=None):
        hidden = None
        if self.gate_proj.bias is None and self.up_proj.bias is None:  # a backend's fused call
            gate, up = self.gate_proj.kernel.get_value(), self.up_proj.kernel.get_value()
            hidden = gated_matmul(x, gate, up, self.activation_name, live_rows)
        if hidden is None:
            gate, up = apply_linears((self.gate_proj, self.up_proj), x, live_rows)
            hidden = self.activation(gate) * up
        return self.down_proj(hidden, live_rows)
