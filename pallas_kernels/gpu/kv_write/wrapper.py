"""``write_kv``: the step's new K/V into a paired float pool with one Pallas kernel (GPU, or
Pallas's interpreter), after checking its arguments; ``write_kv_reference`` is XLA's scatter."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.gpu.kv_write.kernel import write_kv_call
from pallas_kernels.gpu.ragged_paged_attention.sizes import MAX_HEAD_DIM
from pallas_kernels.validation import FLOAT_DTYPES


def write_kv_reference(k_pages, v_pages, k, v, slot_mapping):
    """XLA's scatter: ``pool[:, slot // page_size, slot % page_size] = new``."""

    def write(pages, new):
        hkv, num_pages, page_size, dim = pages.shape
        flat = pages.reshape(hkv, num_pages * page_size, dim)
        flat = flat.at[:, slot_mapping].set(new.swapaxes(0, 1).astype(pages.dtype))
        return flat.reshape(pages.shape)

    return write(k_pages, k), write(v_pages, v)


def _validate(k_pages, v_pages, k, v, slot_mapping) -> None:
    if k_pages.shape != v_pages.shape or k_pages.dtype != v_pages.dtype:
        raise ValueError(
            f"k_pages and v_pages must match, got {k_pages.shape} {k_pages.dtype} and "
            f"{v_pages.shape} {v_pages.dtype}"
        )
    if k_pages.ndim != 4 or jnp.dtype(k_pages.dtype) not in FLOAT_DTYPES:
        raise ValueError(
            f"k_pages must be a float pool [Hkv, P, page_size, D], got {k_pages.shape} "
            f"{k_pages.dtype} (an 8-bit pool is written by jaxgen.quantization.kv_cache)"
        )
    num_kv_heads, _, _, head_dim = k_pages.shape
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"k_pages: head_dim {head_dim} is over {MAX_HEAD_DIM}")
    for name, new in (("k", k), ("v", v)):
        if new.ndim != 3 or new.shape[1:] != (num_kv_heads, head_dim):
            raise ValueError(f"{name} must be [T, {num_kv_heads}, {head_dim}], got {new.shape}")
    if slot_mapping.shape != (k.shape[0],) or slot_mapping.dtype != jnp.int32:
        raise ValueError(
            f"slot_mapping must be int32 [{k.shape[0]}], got {slot_mapping.dtype} "
            f"{slot_mapping.shape}"
        )


def write_kv(
    k_pages: jax.Array,  # [Hkv, P, page_size, D]
    v_pages: jax.Array,  # as k_pages
    k: jax.Array,  # [T, Hkv, D]
    v: jax.Array,  # [T, Hkv, D]
    slot_mapping: jax.Array,  # [T] int32: page * page_size + offset, in bounds
    *,
    interpret: bool = False,
):
    """``(k_pages, v_pages)`` with token t's keys and values at slot ``slot_mapping[t]``, by one
    kernel launch whose outputs alias the pools (in place inside a jitted step that donates
    them); tokens sharing a slot (the engine's padding, on its scratch page) leave one of their
    values there."""
    _validate(k_pages, v_pages, k, v, slot_mapping)
    if k.shape[0] == 0:
        return k_pages, v_pages
    return write_kv_call(k_pages, v_pages, k, v, slot_mapping, interpret=interpret)
