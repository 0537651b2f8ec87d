"""Decode step at batch 64 on the default model: the full step against the same step with
attention removed (matmuls only), to show where step time goes.

    python benchmarks/decode_step_breakdown.py
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxgen.attention import AttentionMetadata
from jaxgen.loaders import load_model

m = load_model(None)
cfg = m.config
P, S, B, W = 200, 16, 64, 8
kv = [(jnp.zeros((3, P, S, 64)), jnp.zeros((3, P, S, 64))) for _ in range(30)]


def md():
    return AttentionMetadata(
        slot_mapping=np.arange(B, dtype=np.int32) + 16,
        decode_lengths=np.full(B, 100, np.int32),
        decode_block_tables=np.tile(np.arange(1, W + 1, dtype=np.int32), (B, 1)),
        prefill_query_index=np.zeros((0, 16), np.int32),
        prefill_query_positions=np.zeros((0, 16), np.int32),
        prefill_block_tables=np.zeros((0, 1), np.int32),
        prefill_cu_q_lens=np.zeros(1, np.int32),
        prefill_kv_lens=np.zeros(0, np.int32),
        prefill_seq_block_tables=np.zeros((0, 1), np.int32),
        prefill_num_seqs=np.zeros(1, np.int32),
    )


def step(params, kv, ids, pos, md, mode):
    model = nnx.merge(m.graphdef, params)
    if mode == "matmul":
        x = model.embed_tokens(ids)
        for layer in model.layers:
            a = layer.self_attn
            x = x + a.o_proj(a.q_proj(x)) + a.k_proj(x).sum() + a.v_proj(x).sum()
            x = x + layer.mlp(x)
        return kv, jnp.argmax(model.compute_logits(x), -1)
    h, kv = model(ids, pos, kv, md)
    return kv, jnp.argmax(model.compute_logits(h), -1)


for mode in ["matmul", "full"]:
    f = jax.jit(step, static_argnums=(5,), donate_argnums=(1,))
    ids = np.arange(B, dtype=np.int32)
    pos = np.full(B, 99, np.int32)
    t = time.time()
    kv, o = f(m.params, kv, ids, pos, md(), mode)
    o.block_until_ready()
    print(mode, "compile+run", time.time() - t)
    ts = []
    for _ in range(5):
        t = time.time()
        kv, o = f(m.params, kv, ids, pos, md(), mode)
        o.block_until_ready()
        ts.append(time.time() - t)
    print(mode, "step", np.median(ts), B / np.median(ts), "tok/s")
