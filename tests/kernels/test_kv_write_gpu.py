"""The Pallas K/V write (``pallas_kernels/gpu/kv_write``) against XLA's scatter: shuffled slots
across pages, head counts and head dims that are not powers of two, bf16 and float32 pools,
padding tokens on the scratch page; its ValueErrors; its CUDA lowering (one Triton kernel whose
outputs alias the pools)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.gpu.abstract_device import abstract_gpu
from pallas_kernels.gpu.kv_write import write_kv, write_kv_reference

INTERPRET = jax.default_backend() != "gpu"


def _case(seed, *, num_kv_heads, head_dim, dtype, page_size=8, num_pages=6, tokens=9):
    rng = np.random.default_rng(seed)
    shape = (num_kv_heads, num_pages, page_size, head_dim)
    k_pages = jnp.asarray(rng.normal(size=shape), dtype)
    v_pages = jnp.asarray(rng.normal(size=shape), dtype)
    k = jnp.asarray(rng.normal(size=(tokens, num_kv_heads, head_dim)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(tokens, num_kv_heads, head_dim)), jnp.float32)
    # Distinct real slots on pages 1.. in shuffled order (straddling page ends), then two
    # padding tokens on the scratch page's slot 0.
    real = rng.permutation(np.arange(page_size, num_pages * page_size))[: tokens - 2]
    slots = jnp.asarray(np.concatenate([real, [0, 0]]), jnp.int32)
    return k_pages, v_pages, k, v, slots


@pytest.mark.parametrize(
    "num_kv_heads, head_dim, dtype",
    [(2, 64, jnp.bfloat16), (3, 96, jnp.float32), (8, 128, jnp.bfloat16), (1, 256, jnp.float32)],
)
def test_matches_the_scatter(num_kv_heads, head_dim, dtype):
    args = _case(num_kv_heads * head_dim, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype)
    expected = write_kv_reference(*args)
    actual = jax.jit(functools.partial(write_kv, interpret=INTERPRET))(*args)
    for got, want in zip(actual, expected, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        # Page 0 is scratch: two padding tokens raced for its slot 0.
        np.testing.assert_array_equal(np.asarray(got[:, 1:]), np.asarray(want[:, 1:]))
        np.testing.assert_array_equal(np.asarray(got[:, 0, 1:]), np.asarray(want[:, 0, 1:]))


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda a: (a[0], a[1][:, :-1], *a[2:]), "k_pages and v_pages must match"),
        (lambda a: (a[0].astype(jnp.int8), a[1].astype(jnp.int8), *a[2:]), "float pool"),
        (lambda a: (*a[:2], a[2][:, :1], *a[3:]), "k must be"),
        (lambda a: (*a[:4], a[4].astype(jnp.float32)), "slot_mapping must be int32"),
        (lambda a: (*a[:4], a[4][:-1]), "slot_mapping must be int32"),
    ],
)
def test_rejects_bad_arguments(change, match):
    args = change(_case(0, num_kv_heads=2, head_dim=64, dtype=jnp.float32))
    with pytest.raises(ValueError, match=match):
        write_kv(*args, interpret=True)


def test_lowers_for_cuda_in_place():
    """Lowered for CUDA from this host: one Triton kernel, its outputs aliased to the donated
    pools (no pool-sized copy), no XLA scatter."""
    pool = jax.ShapeDtypeStruct((8, 4096, 16, 128), jnp.bfloat16)
    new = jax.ShapeDtypeStruct((2, 8, 128), jnp.bfloat16)
    slots = jax.ShapeDtypeStruct((2,), jnp.int32)
    with abstract_gpu():
        text = (
            jax.jit(write_kv, donate_argnums=(0, 1))
            .trace(pool, pool, new, new, slots)
            .lower(lowering_platforms=("cuda",))
            .as_text()
        )
    assert text.count("kv_write") >= 1
    assert "scatter" not in text
    assert "output_operand_aliases" in text
