"""The step's new keys and values written into their pool slots by one Pallas Triton kernel, in
place (the pools are aliased to the outputs), where XLA writes them with two scatters.

Grid ``(token,)``: a program reads its token's slot, and copies the token's ``[Hkv, D]`` keys and
values into ``pool[:, page, offset, :]`` of each pool. Float pools only (an 8-bit pool's codes
and scales are written by ``jaxgen.quantization.kv_cache``). Heads and lanes are padded to
powers of two for Triton and masked; masked stores go past the array (the interpreter drops
them, the GPU never touches them), as in ``ragged_paged_attention/tiles.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.gpu.ragged_paged_attention.sizes import next_power_of_2, padded_head_dim

NUM_WARPS = 1  # [Hkv, D] elements a token: a few hundred, one warp's worth


def _indices(num_kv_heads: int, head_dim: int):
    """``(heads, lanes, valid)``, each ``[H', D']`` (powers of two), in bounds where valid;
    ``valid`` None (the plain iotas: Triton then moves each row's lanes 16 bytes at a time) when
    both sizes are powers of two."""
    rows, lanes = next_power_of_2(num_kv_heads), padded_head_dim(head_dim)
    head = jnp.arange(rows, dtype=jnp.int32)
    lane = jnp.arange(lanes, dtype=jnp.int32)
    shape = (rows, lanes)
    if (rows, lanes) == (num_kv_heads, head_dim):
        return jnp.broadcast_to(head[:, None], shape), jnp.broadcast_to(lane[None, :], shape), None
    valid = (head < num_kv_heads)[:, None] & (lane < head_dim)[None, :]
    heads = jnp.broadcast_to(jnp.minimum(head, num_kv_heads - 1)[:, None], shape)
    lanes_index = jnp.broadcast_to(jnp.minimum(lane, head_dim - 1)[None, :], shape)
    return heads, lanes_index, valid


def _write_kernel(slots_ref, k_ref, v_ref, k_pool_in, v_pool_in, k_pool_ref, v_pool_ref):
    """One token: ``pool[h, slot // page_size, slot % page_size, :] = new[token, h, :]``."""
    del k_pool_in, v_pool_in  # aliased to the outputs
    num_kv_heads, num_pages, page_size, head_dim = k_pool_ref.shape
    token = pl.program_id(0)
    slot = slots_ref[token]
    heads, lanes, valid = _indices(num_kv_heads, head_dim)
    tokens = jnp.full(heads.shape, token, jnp.int32)
    pages = jnp.full(heads.shape, slot // page_size, jnp.int32)
    offsets = jnp.full(heads.shape, slot % page_size, jnp.int32)
    for new_ref, pool_ref in ((k_ref, k_pool_ref), (v_ref, v_pool_ref)):
        if valid is None:
            values = plgpu.load(new_ref.at[tokens, heads, lanes])
            plgpu.store(pool_ref.at[heads, pages, offsets, lanes], values.astype(pool_ref.dtype))
            continue
        values = plgpu.load(new_ref.at[tokens, heads, lanes], mask=valid, other=0)
        plgpu.store(
            pool_ref.at[jnp.where(valid, heads, num_kv_heads), pages, offsets, lanes],
            values.astype(pool_ref.dtype),
            mask=valid,
        )


def write_kv_call(k_pages, v_pages, k, v, slot_mapping, *, interpret: bool):
    """``(k_pages, v_pages)`` with ``k``/``v [T, Hkv, D]`` written at ``slot_mapping [T]``."""
    num_tokens = k.shape[0]
    whole = [pl.BlockSpec(x.shape, lambda *_, n=x.ndim: (0,) * n) for x in (k_pages, v_pages)]
    moved = 2 * num_tokens * k.shape[1] * k.shape[2]
    return pl.pallas_call(
        _write_kernel,
        grid=(num_tokens,),
        in_specs=[
            pl.BlockSpec(slot_mapping.shape, lambda t: (0,)),
            pl.BlockSpec(k.shape, lambda t: (0, 0, 0)),
            pl.BlockSpec(v.shape, lambda t: (0, 0, 0)),
            *whole,
        ],
        out_specs=whole,
        out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (k_pages, v_pages)],
        input_output_aliases={3: 0, 4: 1},
        interpret=interpret,
        compiler_params=None if interpret else plgpu.CompilerParams(num_warps=NUM_WARPS),
        cost_estimate=pl.CostEstimate(
            flops=0,
            transcendentals=0,
            bytes_accessed=moved * (k.dtype.itemsize + k_pages.dtype.itemsize) + 4 * num_tokens,
        ),
        name="kv_write",
    )(slot_mapping, k, v, k_pages, v_pages)
