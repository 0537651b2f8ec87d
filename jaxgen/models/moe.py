"""Mixture-of-experts MLP (Mixtral, Qwen3-MoE): a top-k softmax router and stacked SwiGLU
experts run as grouped matmuls over the tokens each expert was given.

Routing (as transformers): ``softmax(router(x))`` in float32, the ``k`` largest probabilities
per token, renormalised to sum to 1 when ``norm_topk_prob``. Dispatch: the ``T * k`` (token,
expert) assignments are sorted by expert, so each expert's tokens are one contiguous segment,
and every expert multiplies only its own segment (:func:`grouped_mlp`). The cost follows the
active experts, not the total: no expert runs on a token that did not pick it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxgen.config import ModelConfig
from jaxgen.layers.linear import Linear, kernel_initializer
from jaxgen.models.mlp import MLP


def route(
    logits: jax.Array,  # [T, E]
    k: int,
    normalize: bool,
) -> tuple[jax.Array, jax.Array]:  # weights [T, k] float32, experts [T, k] int32
    """The ``k`` experts of each token and their weights."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    weights, experts = jax.lax.top_k(probs, k)
    if normalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, experts.astype(jnp.int32)


def block_rows(num_assignments: int, num_experts: int) -> int:
    """Rows per block of :func:`grouped_mlp`: 1 (one block per assignment: nothing padded)
    while assignments are no more than experts (decode), else about a fair share per expert."""
    if num_assignments <= num_experts:
        return 1
    share = -(-num_assignments // num_experts)
    return 1 << (share - 1).bit_length()


def grouped_mlp(
    rows: jax.Array,  # [N, B, D] rows of one expert per block
    gate_proj: jax.Array,  # [E, D, F]
    up_proj: jax.Array,  # [E, D, F]
    down_proj: jax.Array,  # [E, F, D]
    block_expert: jax.Array,  # [N] int32
) -> jax.Array:  # [N, B, D]
    """Each block of rows through its own expert's SwiGLU MLP, one block after another: a block
    reads only its expert's weights (a dynamic slice, which XLA:CPU copies far faster than it
    gathers), so unused experts are never read."""

    def block(args):
        x, expert = args
        weight = lambda w: jax.lax.dynamic_index_in_dim(w, expert, 0, keepdims=False)  # noqa: E731
        hidden = jax.nn.silu(jnp.dot(x, weight(gate_proj))) * jnp.dot(x, weight(up_proj))
        return jnp.dot(hidden, weight(down_proj))

    return jax.lax.map(block, (rows, block_expert))


class Dispatch:
    """Where each (token, expert) assignment sits once sorted by expert and padded to blocks.

    ``slot_token [N * B]``: the token of each slot (``T``, a zero row, for padding);
    ``slot_weight [N * B]``: its routing weight (0 for padding); ``block_expert [N]``.
    """

    def __init__(self, experts: jax.Array, weights: jax.Array, num_experts: int):
        num_tokens, k = experts.shape
        count = num_tokens * k
        rows = block_rows(count, num_experts)
        flat = experts.reshape(-1)  # [A]
        order = jnp.argsort(flat, stable=True)
        sorted_expert = flat[order]
        token = (order // k).astype(jnp.int32)
        counts = jnp.bincount(flat, length=num_experts)  # [E]
        padded = -(-counts // rows) * rows
        padded_end = jnp.cumsum(padded)
        start = jnp.cumsum(counts) - counts
        rank = jnp.arange(count, dtype=jnp.int32) - start[sorted_expert]
        dest = padded_end[sorted_expert] - padded[sorted_expert] + rank  # [A]
        num_blocks = count if rows == 1 else -(-count // rows) + num_experts
        slots = num_blocks * rows
        self.rows, self.num_blocks = rows, num_blocks
        self.slot_token = jnp.full((slots,), num_tokens, jnp.int32).at[dest].set(token)
        self.slot_weight = jnp.zeros((slots,), jnp.float32).at[dest].set(weights.reshape(-1)[order])
        block_start = jnp.arange(num_blocks, dtype=jnp.int32) * rows
        block_expert = jnp.searchsorted(padded_end, block_start, side="right")
        self.block_expert = jnp.clip(block_expert, 0, num_experts - 1).astype(jnp.int32)


class Experts(nnx.Module):
    """``num_experts`` SwiGLU MLPs as stacked weights ``[E, in, out]``."""

    def __init__(self, num_experts: int, d: int, f: int, *, dtype, rngs: nnx.Rngs):
        init = kernel_initializer(rngs, in_axis=-2, out_axis=-1, batch_axis=(0,))
        self.gate_proj = nnx.Param(init(rngs.params(), (num_experts, d, f), dtype))
        self.up_proj = nnx.Param(init(rngs.params(), (num_experts, d, f), dtype))
        self.down_proj = nnx.Param(init(rngs.params(), (num_experts, f, d), dtype))

    def __call__(self, x: jax.Array, dispatch: Dispatch) -> jax.Array:  # [T, D] -> [T, D]
        num_tokens, d = x.shape
        padded = jnp.concatenate([x, jnp.zeros((1, d), x.dtype)], axis=0)
        rows = padded[dispatch.slot_token].reshape(dispatch.num_blocks, dispatch.rows, d)
        out = grouped_mlp(
            rows,
            self.gate_proj[...],
            self.up_proj[...],
            self.down_proj[...],
            dispatch.block_expert,
        )
        out = out.reshape(-1, d) * dispatch.slot_weight[:, None].astype(out.dtype)
        return jnp.zeros((num_tokens + 1, d), x.dtype).at[dispatch.slot_token].add(out)[:-1]


class SparseMoE(nnx.Module):
    """Router, experts, and (when configured) a shared expert every token runs, gated by
    ``sigmoid(shared_expert_gate(x))``."""

    def __init__(self, config: ModelConfig, *, dtype, rngs: nnx.Rngs):
        moe, d = config.moe, config.hidden_size
        self.num_experts, self.top_k, self.normalize = (
            moe.num_experts,
            moe.num_experts_per_token,
            moe.norm_topk_prob,
        )
        self.router = Linear(d, moe.num_experts, bias=False, dtype=dtype, rngs=rngs)
        self.experts = Experts(moe.num_experts, d, moe.expert_size, dtype=dtype, rngs=rngs)
        if moe.shared_expert_size:
            self.shared_expert = MLP(config, dtype=dtype, rngs=rngs, width=moe.shared_expert_size)
            self.shared_expert_gate = Linear(d, 1, bias=False, dtype=dtype, rngs=rngs)
        else:
            self.shared_expert = self.shared_expert_gate = None

    def __call__(self, x, live_rows=None):  # [T, D] -> [T, D]
        weights, experts = route(self.router(x, live_rows), self.top_k, self.normalize)
        out = self.experts(x, Dispatch(experts, weights.astype(x.dtype), self.num_experts))
        if self.shared_expert is not None:
            gate = jax.nn.sigmoid(self.shared_expert_gate(x, live_rows))
            out = out + gate * self.shared_expert(x, live_rows)
        return out
