"""Decode step at batch 64 on the default model: where step time goes.

Variants, each one jitted step with the KV pool donated, on scattered page tables (as a busy pool
has them) and context lengths spread over 40-128 tokens:
  matmul     - the projections, MLP and LM head only (no attention, no KV writes), XLA's dot
  matmul-cpu - the same on the native CPU matmul over packed weights (when it builds)
  reference  - the full step: XLA's dot and the pure-JAX paged attention (gather + batched dots)
  cpu        - the full step as the engine runs it on CPU: native decode kernel, native matmul

    python benchmarks/decode_step_breakdown.py [--batch 64] [--repeats 7] [--modes cpu,matmul-cpu]
        [--quantization auto|none]
"""

import argparse
import time

import jax
import numpy as np
from flax import nnx

from jaxgen.backends import select_backend
from jaxgen.backends.cpu_kernels import cpu_kernel_available, matmul_kernel_available
from jaxgen.layers.attention import AttentionMetadata
from jaxgen.loaders import load_model

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--repeats", type=int, default=7)
parser.add_argument("--modes", default=None, help="comma-separated subset of the variants above")
parser.add_argument(
    "--quantization", default="auto", help="load_model's: auto (the GGUF kept) or none (float32)"
)
args = parser.parse_args()

m = load_model(None, quantization=args.quantization)
cfg = m.config
B, S, W = args.batch, 16, 8  # batch, page_size, block-table width (128 tokens)
P = 4 * B * W  # a pool four times what the batch uses, pages handed out in random order
rng = np.random.default_rng(0)
tables = rng.permutation(np.arange(1, P))[: B * W].reshape(B, W).astype(np.int32)
lengths = rng.integers(40, W * S + 1, B).astype(np.int32)
slots = (tables[np.arange(B), (lengths - 1) // S] * S + (lengths - 1) % S).astype(np.int32)
shape = (cfg.num_kv_heads, P, S, cfg.head_dim)


def md():
    return AttentionMetadata(
        slot_mapping=slots,
        cu_q_lens=np.arange(B + 1, dtype=np.int32),
        kv_lens=lengths,
        block_tables=tables,
        num_seqs=np.array([B], np.int32),
    )


def step(params, head, kv, ids, pos, md, mode):
    model = nnx.merge(m.graphdef, params)
    if mode.startswith("matmul"):
        x = model.embed_tokens(ids)
        for layer in model.layers:
            a = layer.self_attn
            x = x + a.o_proj(a.q_proj(x)) + a.k_proj(x).sum() + a.v_proj(x).sum()
            x = x + layer.mlp(x)
        logits = model.compute_logits(x, head_kernel=head)
        return None, jax.numpy.argmax(logits, -1)  # pool untouched
    h, kv = model(ids, pos, kv, md, backend=select_backend(mode))
    return kv, jax.numpy.argmax(model.compute_logits(h, head_kernel=head), -1)


native = cpu_kernel_available() and matmul_kernel_available()
modes = ["matmul", "reference"] + (["matmul-cpu", "cpu"] if native else [])
if args.modes:
    modes = [mode for mode in args.modes.split(",") if mode in modes]
# The cpu backend's step parameters: PackedWeight Linear kernels and the tied LM head packed.
packed, packed_head = select_backend("cpu").prepare_params(m.params, cfg) if native else (None,) * 2
ids = np.arange(B, dtype=np.int32)
for mode in modes:
    kv = [(jax.numpy.zeros(shape), jax.numpy.zeros(shape)) for _ in range(cfg.num_layers)]
    # Matmul modes neither donate nor return the pool (returning it would time a pool copy).
    f = jax.jit(step, static_argnums=(6,), donate_argnums=() if "matmul" in mode else (2,))
    params, head = (packed, packed_head) if mode in ("matmul-cpu", "cpu") else (m.params, None)
    start = time.perf_counter()
    new_kv, out = f(params, head, kv, ids, lengths - 1, md(), mode)
    kv = kv if new_kv is None else new_kv
    out.block_until_ready()
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        new_kv, out = f(params, head, kv, ids, lengths - 1, md(), mode)
        kv = kv if new_kv is None else new_kv
        out.block_until_ready()
        times.append(time.perf_counter() - start)
    t = float(np.median(times))
    print(f"{mode:10s} step {t * 1e3:7.1f} ms  {B / t:6.1f} tok/s  (first call {compile_s:.1f} s)")
