"""The RoPE kernel (pallas_kernels/tpu/rotary_embedding/) against its pure-jnp reference in TPU
interpret mode, the reference against the model's own rotation, the pallas-tpu backend's use of
it (and its fallback), its input checks, and its AOT compile for a v5e chip."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from jaxgen.backends import PallasTPUBackend, ReferenceBackend
from jaxgen.layers.rope import apply_rope, rope_angles
from pallas_kernels.tpu.rotary_embedding import (
    rotary_embedding_reference,
    rotary_embedding_supported,
    rotary_embedding_tpu,
)
from tests.backends.test_pallas_tpu_backend import needs_libtpu

INTERPRET = pltpu.InterpretParams(detect_races=True)


def _inputs(tokens, heads, head_dim, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((tokens, heads, head_dim)), dtype)
    positions = jnp.asarray(rng.permutation(8192)[:tokens], jnp.int32)  # shuffled, far apart
    inv_freq = 1.0 / (500000.0 ** (np.arange(0, head_dim, 2) / head_dim))
    cos, sin = rope_angles(positions, jnp.asarray(inv_freq, jnp.float32))  # [T, 1, D / 2]
    return x, (cos, sin)


@pytest.mark.parametrize(
    "tokens, heads, head_dim, dtype",
    [
        (64, 8, 128, jnp.bfloat16),  # Llama-3-8B's query heads per chip of v5e-4
        (64, 9, 64, jnp.bfloat16),  # SmolLM2's 9 heads of 64: 4.5 chunks of 128 lanes
        (37, 3, 64, jnp.float32),  # rows off the tile, 1.5 chunks
        (40, 8, 32, jnp.bfloat16),  # four heads per chunk
        (24, 2, 256, jnp.float32),  # a head over two vregs
        (3000, 3, 128, jnp.float32),  # three row blocks, the last one partial
    ],
)  # fmt: skip
def test_kernel_matches_reference(tokens, heads, head_dim, dtype):
    x, (cos, sin) = _inputs(tokens, heads, head_dim, dtype)
    out = rotary_embedding_tpu(x, cos[:, 0], sin[:, 0], interpret=INTERPRET)
    ref = rotary_embedding_reference(x, cos[:, 0], sin[:, 0])
    assert out.shape == x.shape and out.dtype == x.dtype
    got, want = np.asarray(out, np.float32), np.asarray(ref, np.float32)
    # The same products and sums; XLA:CPU may contract a product and its sum into one fused
    # multiply-add in the interpreted kernel, so a result may differ by one unit.
    ulp = 2.0**-7 if dtype == jnp.bfloat16 else 2.0**-22
    np.testing.assert_allclose(got, want, rtol=ulp, atol=ulp)
    assert not np.allclose(got, np.asarray(x, np.float32))  # it did rotate


def test_reference_is_the_models_rotation():
    x, rope = _inputs(50, 4, 64, jnp.float32)
    np.testing.assert_array_equal(
        rotary_embedding_reference(x, rope[0][:, 0], rope[1][:, 0]), apply_rope(x, rope)
    )


def test_backend_rotates_with_the_kernel_and_falls_back_where_it_does_not_tile():
    backend, reference = PallasTPUBackend(interpret=True), ReferenceBackend()
    x, rope = _inputs(24, 9, 64, jnp.float32)
    np.testing.assert_allclose(
        backend.rotate(x, rope), reference.rotate(x, rope), rtol=2**-22, atol=2**-22
    )
    assert not rotary_embedding_supported(4, 96)  # 96 lanes do not tile 128
    odd, rope = _inputs(8, 4, 96, jnp.float32)
    np.testing.assert_array_equal(backend.rotate(odd, rope), apply_rope(odd, rope))


def test_bad_inputs_are_clear_errors():
    x, (cos, sin) = _inputs(8, 2, 64, jnp.float32)
    with pytest.raises(ValueError, match=r"x must be \[T, H, D\]"):
        rotary_embedding_tpu(x[0], cos[:, 0], sin[:, 0])
    with pytest.raises(ValueError, match=r"cos and sin must be \[8, 32\]"):
        rotary_embedding_tpu(x, cos[:4, 0], sin[:4, 0])
    with pytest.raises(ValueError, match="heads that tile 128 lanes"):
        rotary_embedding_tpu(jnp.zeros((8, 2, 96)), jnp.zeros((8, 48)), jnp.zeros((8, 48)))


@needs_libtpu
@pytest.mark.tpu_compile
def test_kernel_compiles_for_v5e_1():
    """Mosaic takes every lane layout the backend sends it: whole chunks, a half chunk at the
    end (9 heads of 64), several heads per chunk, a head over two vregs."""
    from jax.sharding import Mesh

    from jaxgen.planning.tpu_targets import resolve_target

    devices = resolve_target("v5e-1").devices
    mesh = Mesh(np.array(devices[:1]).reshape(1, 1), ("data", "model"))
    with jax.set_mesh(mesh):
        for tokens, heads, head_dim in ((64, 8, 128), (64, 9, 64), (40, 8, 32), (24, 2, 256)):
            shapes = (
                jax.ShapeDtypeStruct((tokens, heads, head_dim), jnp.bfloat16),
                jax.ShapeDtypeStruct((tokens, head_dim // 2), jnp.float32),
                jax.ShapeDtypeStruct((tokens, head_dim // 2), jnp.float32),
            )
            compiled = jax.jit(rotary_embedding_tpu).trace(*shapes).lower().compile()
            assert "rotary_embedding" in compiled.as_text()
