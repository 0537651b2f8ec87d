"""The streamed matmul (pallas_kernels/tpu/streamed_matmul/kernel.py) against its pure-jnp
reference in TPU interpret mode (DMAs and semaphores simulated, race detection on), its input
checks, and its AOT compile for a v5e chip, where the compiler must count the weight's bytes
once."""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.tpu import (
    streamed_matmul_plan,
    streamed_matmul_reference,
    streamed_matmul_tpu,
)
from pallas_kernels.tpu.streamed_matmul import (
    GATED_ACTIVATIONS,
    rms_norm_reference,
    streamed_gated_matmul_reference,
    streamed_gated_matmul_tpu,
)

INTERPRET = pltpu.InterpretParams(detect_races=True)


def _inputs(rows, depth, columns, dtype, transposed, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((rows, depth)), dtype)  # [M, K]
    w_shape = (columns, depth) if transposed else (depth, columns)
    w = jnp.asarray(rng.standard_normal(w_shape) / np.sqrt(depth), dtype)
    return x, w


@pytest.mark.parametrize(
    "rows, depth, columns, dtype, transposed",
    [
        (1, 256, 384, jnp.float32, False),  # one row
        (13, 128, 1024, jnp.float32, False),  # rows off the 8-row tile
        (8, 4096, 512, jnp.float32, False),  # 4 MiB budget: blocks of 256 columns
        (64, 256, 768, jnp.bfloat16, False),
        (5, 192, 640, jnp.float32, True),  # an embedding [V, K] used as the LM head
        (16, 128, 256, jnp.bfloat16, True),
        (3, 64, 192, jnp.float32, False),  # one block of any width (192 is not 128-aligned)
    ],
)
def test_matches_reference(rows, depth, columns, dtype, transposed):
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call

    x, w = _inputs(rows, depth, columns, dtype, transposed)
    plan = streamed_matmul_plan(rows, depth, columns, jnp.dtype(dtype).itemsize)
    assert plan is not None
    got = streamed_matmul_tpu(x, w, transposed=transposed, interpret=INTERPRET)
    want = streamed_matmul_reference(x, w, transposed=transposed)
    assert got.shape == (rows, columns) and got.dtype == dtype
    tolerance = 2e-2 if dtype == jnp.bfloat16 else 1e-5
    np.testing.assert_allclose(
        np.asarray(got, np.float32), np.asarray(want, np.float32), atol=tolerance, rtol=tolerance
    )
    races = interpret_pallas_call.races
    assert races is None or not races.races_found
    if depth == 4096:  # several blocks: the double buffer is really exercised
        assert columns // plan.block_columns == 2


def test_plan_chooses_lane_aligned_blocks_within_budget():
    plan = streamed_matmul_plan(64, 4096, 14336, 2)  # Llama-3-8B gate/up, one chip
    assert plan.block_columns % 128 == 0 and 14336 % plan.block_columns == 0
    assert 4096 * plan.block_columns * 2 <= 4 * 2**20
    assert streamed_matmul_plan(64, 4096, 32064, 2) is None  # no 128-multiple divides 32064
    assert streamed_matmul_plan(16_384, 8192, 1024, 2) is None  # x alone overflows VMEM


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(x=jnp.zeros((4, 100))), "depth"),
        (dict(x=jnp.zeros((4,))), "2-D"),
        (dict(x=jnp.zeros((4, 128), jnp.bfloat16)), "dtype"),
        (dict(w=jnp.zeros((128, 32064))), "VMEM budget"),  # no block tiles 32064 columns
    ],
)
def test_rejects_bad_inputs(change, match):
    args = dict(x=jnp.zeros((4, 128)), w=jnp.zeros((128, 256)))
    args.update(change)
    with pytest.raises(ValueError, match=match):
        streamed_matmul_tpu(args["x"], args["w"], interpret=INTERPRET)


needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None, reason="libtpu not installed: no Mosaic compiler"
)


@needs_libtpu
@pytest.mark.tpu_compile
@pytest.mark.parametrize(
    "rows, depth, columns, transposed",
    [
        (64, 4096, 14336, False),  # Llama-3-8B gate/up on one chip
        (64, 14336, 4096, False),  # down
        (1, 4096, 1024, False),
        (64, 4096, 32128, True),  # a vocab-split embedding as the LM head, padded to tile
    ],
)
def test_aot_compile_counts_the_weight_once(rows, depth, columns, transposed):
    """No XLA prefetch of the weight into VMEM (it is pinned to HBM) and the compiler's count is
    the weight, x and out once, within 3% of the weight bytes for decode-sized inputs."""
    from jax.experimental import topologies

    topology = topologies.get_topology_desc(
        platform="tpu", topology_name="v5e:1x1", chips_per_host_bounds=(1, 1, 1)
    )
    mesh = jax.sharding.Mesh(np.array(topology.devices[:1]), ("x",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    x = jax.ShapeDtypeStruct((rows, depth), jnp.bfloat16, sharding=sharding)
    w_shape = (columns, depth) if transposed else (depth, columns)
    w = jax.ShapeDtypeStruct(w_shape, jnp.bfloat16, sharding=sharding)
    with jax.set_mesh(mesh):
        step = jax.jit(lambda x, w: streamed_matmul_tpu(x, w, transposed=transposed))
        compiled = step.trace(x, w).lower().compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    weight_bytes = depth * columns * 2
    assert "copy-start" not in compiled.as_text()  # the weight is not prefetched into VMEM
    assert weight_bytes <= cost["bytes accessed"] <= 1.03 * weight_bytes


@pytest.mark.parametrize(
    "rows, depth, columns, dtype, activation",
    [
        (1, 256, 384, jnp.float32, "silu"),
        (13, 128, 1024, jnp.float32, "gelu_tanh"),  # rows off the tile
        (8, 4096, 512, jnp.float32, "silu"),  # two weights share the 4 MiB: blocks of 128
        (64, 512, 768, jnp.bfloat16, "silu"),
    ],
)  # fmt: skip
def test_gated_matches_reference(rows, depth, columns, dtype, activation):
    x, gate = _inputs(rows, depth, columns, dtype, False, seed=1)
    _, up = _inputs(rows, depth, columns, dtype, False, seed=2)
    got = streamed_gated_matmul_tpu(x, gate, up, activation=activation, interpret=INTERPRET)
    want = streamed_gated_matmul_reference(x, gate, up, activation)
    assert got.shape == (rows, columns) and got.dtype == dtype
    tolerance = 2e-2 if dtype == jnp.bfloat16 else 1e-5
    np.testing.assert_allclose(
        np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=tolerance, atol=tolerance
    )
    # And the unfused layers: act(x @ gate) * (x @ up), each product rounded to x's dtype.
    unfused = GATED_ACTIVATIONS[activation](jnp.dot(x, gate)) * jnp.dot(x, up)
    np.testing.assert_allclose(
        np.asarray(got, np.float32), np.asarray(unfused, np.float32), rtol=tolerance, atol=tolerance
    )


def test_gated_bad_inputs_are_clear_errors():
    x, gate = _inputs(4, 128, 256, jnp.float32, False)
    with pytest.raises(ValueError, match="activation must be one of 'silu', 'gelu_tanh'"):
        streamed_gated_matmul_tpu(x, gate, gate, activation="gelu")
    with pytest.raises(ValueError, match="gate and up must share a shape and dtype"):
        streamed_gated_matmul_tpu(x, gate, gate[:, :128])


def test_streamed_weights_fuse_the_gate_only_where_the_kernel_takes_it():
    """``StreamedWeight.matmul_gated``: one call for a column-split (or whole) gate and up with
    an activation the kernel has; None (two matmuls) for an exact GELU or a transposed kernel."""
    from jaxgen.backends.streamed_weight import StreamedWeight

    x, gate = _inputs(8, 256, 384, jnp.float32, False, seed=3)
    _, up = _inputs(8, 256, 384, jnp.float32, False, seed=4)
    g, u = (StreamedWeight.wrap(w, interpret=True) for w in (gate, up))
    got = StreamedWeight.matmul_gated(x, g, u, "silu")
    np.testing.assert_allclose(got, jax.nn.silu(x @ gate) * (x @ up), rtol=1e-5, atol=1e-5)
    assert StreamedWeight.matmul_gated(x, g, u, "gelu") is None
    t = StreamedWeight.wrap(gate.T, transposed=True, interpret=True)
    assert StreamedWeight.matmul_gated(x, t, t, "silu") is None


def _norm_inputs(rows, depth, dtype, seed):
    """Rows of a residual stream (an offset and a spread of scales) and an RMSNorm weight."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, depth)) * rng.uniform(0.1, 8.0, (rows, 1)) + 0.5
    return jnp.asarray(x, dtype), jnp.asarray(rng.uniform(0.5, 1.5, depth), dtype)


@pytest.mark.parametrize(
    "rows, depth, columns, dtype, transposed, gated",
    [
        (1, 256, 384, jnp.float32, False, False),
        (13, 128, 1024, jnp.float32, True, False),  # rows off the tile; the LM head's layout
        (8, 4096, 512, jnp.float32, False, False),  # two blocks: the normed rows kept between
        (64, 256, 768, jnp.bfloat16, False, False),
        (13, 512, 768, jnp.bfloat16, False, True),
        (8, 4096, 512, jnp.float32, False, True),  # four blocks of both weights
    ],
)  # fmt: skip
def test_norm_prologue_matches_reference(rows, depth, columns, dtype, transposed, gated):
    """``norm=(weight, eps)``: the kernel norms x in VMEM and multiplies the result, as the same
    call on rows normed by XLA beforehand (``rms_norm_reference``, the model's RMSNorm)."""
    x, weight = _norm_inputs(rows, depth, dtype, seed=rows)
    _, w = _inputs(rows, depth, columns, dtype, transposed, seed=1)
    _, up = _inputs(rows, depth, columns, dtype, False, seed=2)
    normed = rms_norm_reference(x, weight, 1e-5)
    if gated:
        got = streamed_gated_matmul_tpu(x, w, up, norm=(weight, 1e-5), interpret=INTERPRET)
        unfused = streamed_gated_matmul_tpu(normed, w, up, interpret=INTERPRET)
        want = streamed_gated_matmul_reference(normed, w, up, "silu")
    else:
        got = streamed_matmul_tpu(
            x, w, transposed=transposed, norm=(weight, 1e-5), interpret=INTERPRET
        )
        unfused = streamed_matmul_tpu(normed, w, transposed=transposed, interpret=INTERPRET)
        want = streamed_matmul_reference(normed, w, transposed=transposed)
    assert got.shape == (rows, columns) and got.dtype == dtype
    # The norm's sum of squares may be added in another order than XLA's mean: one rounding.
    np.testing.assert_allclose(
        np.asarray(got, np.float32), np.asarray(unfused, np.float32), rtol=1e-5, atol=1e-5
    )
    tolerance = 2e-2 if dtype == jnp.bfloat16 else 1e-5
    np.testing.assert_allclose(
        np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=tolerance, atol=tolerance
    )


@pytest.mark.parametrize(
    "norm, match",
    [
        ((jnp.ones(64), 1e-5), r"norm's weight must be \[128\] float32"),
        ((jnp.ones(128, jnp.bfloat16), 1e-5), r"norm's weight must be \[128\] float32"),
        ((jnp.ones(128), 0.0), "norm's eps must be a positive float"),
        (jnp.ones(128), r"norm must be None or \(weight, eps\)"),
    ],
)
def test_norm_bad_inputs_are_clear_errors(norm, match):
    x, w = _inputs(4, 128, 256, jnp.float32, False)
    with pytest.raises(ValueError, match=match):
        streamed_matmul_tpu(x, w, norm=norm, interpret=INTERPRET)
    with pytest.raises(ValueError, match=match):
        streamed_gated_matmul_tpu(x, w, w, norm=norm, interpret=INTERPRET)


def test_streamed_weights_take_a_normed_input():
    """A ``NormedInput`` (the model's deferred RMSNorm) through the kernel protocol: the grouped
    matmuls and the gated call norm it in the kernel; too many rows for the kernel, XLA norms it
    first; either way the model's ``rms_norm(x) @ w``."""
    from jaxgen.backends.streamed_weight import StreamedWeight
    from jaxgen.layers.linear import NormedInput, gated_matmul, matmuls, rms_norm

    for rows in (8, 600):  # streamed, and past MAX_STREAMED_ROWS: XLA's dot
        x, weight = _norm_inputs(rows, 256, jnp.float32, seed=7)
        _, gate = _inputs(rows, 256, 384, jnp.float32, False, seed=3)
        _, up = _inputs(rows, 256, 384, jnp.float32, False, seed=4)
        g, u = (StreamedWeight.wrap(w, interpret=True) for w in (gate, up))
        normed_input = NormedInput(x, weight, 1e-6)
        normed = rms_norm(x, weight, 1e-6)
        got = matmuls(normed_input, [g, u])
        for out, w in zip(got, (gate, up), strict=True):
            np.testing.assert_allclose(out, normed @ w, rtol=1e-5, atol=1e-5)
        fused = gated_matmul(normed_input, g, u, "silu")
        if rows > 512:
            assert fused is None  # the caller runs the two matmuls
        else:
            want = jax.nn.silu(normed @ gate) * (normed @ up)
            np.testing.assert_allclose(fused, want, rtol=1e-5, atol=1e-5)


@needs_libtpu
@pytest.mark.tpu_compile
@pytest.mark.parametrize("gated", [False, True])
def test_aot_compile_of_the_norm_prologue_counts_x_once(gated):
    """With ``norm=``, Mosaic compiles the prologue for v5e and the count is the weights, x,
    the norm's weight and out (within 1%): no normed copy of x goes to HBM."""
    from jax.experimental import topologies

    topology = topologies.get_topology_desc(
        platform="tpu", topology_name="v5e:1x1", chips_per_host_bounds=(1, 1, 1)
    )
    mesh = jax.sharding.Mesh(np.array(topology.devices[:1]), ("x",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    rows, depth, columns = 64, 4096, 1024
    x = jax.ShapeDtypeStruct((rows, depth), jnp.bfloat16, sharding=sharding)
    weight = jax.ShapeDtypeStruct((depth,), jnp.bfloat16, sharding=sharding)
    w = jax.ShapeDtypeStruct((depth, columns), jnp.bfloat16, sharding=sharding)

    def step(x, weight, w):
        if gated:
            return streamed_gated_matmul_tpu(x, w, w, norm=(weight, 1e-5))
        return streamed_matmul_tpu(x, w, norm=(weight, 1e-5))

    with jax.set_mesh(mesh):
        compiled = jax.jit(step).trace(x, weight, w).lower().compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    expected = ((1 + gated) * depth * columns + rows * depth + rows * columns + depth) * 2
    assert expected <= cost["bytes accessed"] <= 1.01 * expected
