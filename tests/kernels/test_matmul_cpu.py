"""The native CPU matmul over panel-packed weights against ``jnp.dot`` in float64 (rows not a
multiple of the 4-row tile, depth across several 256-deep blocks, few and many panels), inside
jit, and the engine's use of it: ``Linear`` runs ``PackedWeight`` kernels on it (grouped), the
runner packs only for the "cpu" backend, and greedy output matches the reference backend."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxgen.backends.cpu import pack_linear_weights
from jaxgen.backends.cpu_kernels import (
    PackedWeight,
    matmul_cpu,
    matmul_cpu_group,
    matmul_kernel_available,
    pack_weight,
    unpack_weight,
)
from jaxgen.layers.linear import Linear, apply_linears

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "cpu" or not matmul_kernel_available(),
    reason="needs the CPU backend, a C++ compiler and AVX2 + FMA",
)


@pytest.mark.parametrize(
    "rows, depth, columns",
    [
        (1, 1, 1),
        (3, 7, 30),  # everything smaller than one tile, a padded panel
        (64, 576, 192),  # SmolLM2 k/v projection at batch 64
        (67, 600, 97),  # ragged rows, depth past two blocks, a padded last panel
        (300, 64, 528),  # several row blocks of 128, a partial column block
        (5, 513, 2016),  # 84 panels: the 8-panel column blocks
    ],
)
def test_matches_dot(rows, depth, columns):
    rng = np.random.default_rng(rows * 7 + columns)
    x = jnp.asarray(rng.standard_normal((rows, depth)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((depth, columns)), jnp.float32)
    actual = np.asarray(matmul_cpu(x, pack_weight(w), columns))
    expected = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5 * np.sqrt(depth))


@pytest.mark.parametrize(
    "spans",
    [
        [[0, 5], [8, 19]],  # decode rows then prefill rows, padding after each, not tile aligned
        [[0, 0], [16, 300]],  # no decodes; a prefill span past several 128-row blocks
        [[0, 37], [37, 37]],  # one span, padding at the end only
        [[0, 0], [0, 0]],  # nothing live: all zeros
        [[0, 400], [3, 2]],  # clamped to the rows; an empty (reversed) span
    ],
)
def test_live_rows_compute_only_their_rows(spans):
    rows, depth, columns = 320, 200, 100
    rng = np.random.default_rng(len(str(spans)))
    x = jnp.asarray(rng.standard_normal((rows, depth)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((depth, columns)), jnp.float32)
    live = np.asarray(spans, np.int32)
    actual = np.asarray(
        jax.jit(matmul_cpu, static_argnums=2)(x, pack_weight(w), columns, live_rows=live)
    )
    expected = np.zeros((rows, columns))
    for begin, end in live:
        begin, end = min(max(begin, 0), rows), min(max(end, begin), rows)
        expected[begin:end] = np.asarray(x[begin:end], np.float64) @ np.asarray(w, np.float64)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5 * np.sqrt(depth))
    with pytest.raises(ValueError, match="live_rows"):
        matmul_cpu(x, pack_weight(w), columns, live_rows=live[:1])


# Live spans: many rows (column blocks balanced over threads), one decode row and four rows in
# two spans (each thread one stretch of the group's panels, crossing weights).
GROUP_SPANS = [[[0, 9], [12, 45]], [[0, 1], [0, 0]], [[0, 2], [20, 22]]]


@pytest.mark.parametrize("spans", GROUP_SPANS)
def test_group_matches_dot_for_each_weight(spans):
    # q/k/v-like: three weights of different widths (one with a padded panel) read one x; rows
    # in live spans with padding between and after.
    rows, depth = 50, 300
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.standard_normal((rows, depth)), jnp.float32)
    widths = (576, 192, 100)
    weights = [jnp.asarray(rng.standard_normal((depth, n)), jnp.float32) for n in widths]
    live = np.array(spans, np.int32)
    run = jax.jit(lambda x, ws, live: matmul_cpu_group(x, ws, list(widths), live_rows=live))
    outputs = run(x, [pack_weight(w) for w in weights], live)
    mask = np.zeros((rows, 1))
    for begin, end in spans:
        mask[begin:end] = 1
    for w, actual in zip(weights, outputs, strict=True):
        expected = mask * (np.asarray(x, np.float64) @ np.asarray(w, np.float64))
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5 * np.sqrt(depth))
    assert (
        run.lower(x, [pack_weight(w) for w in weights], live).as_text().count("jaxgen_matmul_f32")
        == 1
    )  # one call for the group
    with pytest.raises(ValueError, match="at least one"):
        matmul_cpu_group(x, [])
    with pytest.raises(ValueError, match="columns has 1 entries for 2"):
        matmul_cpu_group(x, [pack_weight(weights[1])] * 2, [192])
    with pytest.raises(ValueError, match="depth"):
        matmul_cpu_group(x[:, :10], [pack_weight(weights[1])])


def test_concurrent_callers_get_their_own_results():
    # Python threads running jitted matmuls at once: one call holds the kernels' worker pool,
    # the others find it busy and run their items on their own thread.
    import concurrent.futures

    rng = np.random.default_rng(6)
    w = jnp.asarray(rng.standard_normal((256, 480)), jnp.float32)
    packed = pack_weight(w)
    inputs = [jnp.asarray(rng.standard_normal((96, 256)), jnp.float32) for _ in range(8)]
    run = jax.jit(matmul_cpu)
    run(inputs[0], packed).block_until_ready()

    def repeat(x):
        return [np.asarray(run(x, packed)) for _ in range(20)]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(repeat, inputs))
    for x, outputs in zip(inputs, results, strict=True):
        expected = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
        for actual in outputs:
            np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-3)


def test_one_thread_when_capped(tmp_path):
    # JAXGEN_CPU_THREADS=1 leaves the pool without workers: every job runs on its caller.
    import subprocess
    import sys

    script = (
        "import numpy as np, jax.numpy as jnp\n"
        "from jaxgen.backends.cpu_kernels import matmul_cpu, pack_weight\n"
        "rng = np.random.default_rng(0)\n"
        "x, w = rng.standard_normal((37, 300)), rng.standard_normal((300, 130))\n"
        "x32, w32 = jnp.asarray(x, jnp.float32), jnp.asarray(w, jnp.float32)\n"
        "out = np.asarray(matmul_cpu(x32, pack_weight(w32), 130))\n"
        "expected = np.asarray(x32, np.float64) @ np.asarray(w32, np.float64)\n"
        "np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)\n"
        "print('ok')\n"
    )
    env = {**os.environ, "JAXGEN_CPU_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_pack_round_trip_and_errors():
    w = jnp.arange(10 * 45, dtype=jnp.float32).reshape(10, 45)
    packed = pack_weight(w)
    assert packed.shape == (2, 10, 24)
    np.testing.assert_array_equal(unpack_weight(packed, 45), w)
    with pytest.raises(ValueError, match="float32"):
        pack_weight(jnp.ones((10, 48), jnp.bfloat16))
    with pytest.raises(ValueError, match="columns"):
        matmul_cpu(jnp.ones((4, 10), jnp.float32), packed, 24)
    with pytest.raises(ValueError, match="depth"):
        matmul_cpu(jnp.ones((4, 9), jnp.float32), packed)
    with pytest.raises(ValueError, match="x must be float32"):
        matmul_cpu(jnp.ones((4, 10), jnp.bfloat16), packed)


def test_inside_jit_with_leading_dimensions():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((2, 9, 40)), jnp.float32)  # [B, T, K]
    w = jnp.asarray(rng.standard_normal((40, 72)), jnp.float32)
    packed = pack_weight(w)
    actual = jax.jit(lambda x, p: matmul_cpu(x, p) + matmul_cpu(2 * x, p))(x, packed)
    assert actual.shape == (2, 9, 72)
    expected = 3 * np.einsum("btk,kn->btn", np.asarray(x, np.float64), np.asarray(w, np.float64))
    np.testing.assert_allclose(np.asarray(actual), expected, rtol=1e-5, atol=1e-4)


def test_linear_runs_packed_kernels_on_the_native_matmul():
    layer = Linear(16, 45, bias=True, dtype=jnp.float32, rngs=nnx.Rngs(0))
    layer.bias[...] = jnp.arange(45, dtype=jnp.float32)
    x = jnp.asarray(np.random.default_rng(2).standard_normal((5, 16)), jnp.float32)
    expected = layer(x)
    graphdef, params = nnx.split(layer)
    packed = pack_linear_weights(params)[0]
    kernel = packed["kernel"].get_value()
    assert isinstance(kernel, PackedWeight) and kernel.panels.shape == (2, 16, 24)
    assert kernel.shape == (16, 45) and params["kernel"][...].shape == (16, 45)
    np.testing.assert_array_equal(kernel.unpack(), params["kernel"][...])

    def run(state, x):
        return nnx.merge(graphdef, state)(x)

    np.testing.assert_allclose(jax.jit(run)(packed, x), expected, rtol=1e-5, atol=1e-5)
    assert jax.jit(run).lower(packed, x).as_text().count("jaxgen_matmul_f32") == 1
    assert jax.jit(run).lower(params, x).as_text().count("jaxgen_matmul_f32") == 0
    layers = (layer, Linear(16, 30, bias=False, dtype=jnp.float32, rngs=nnx.Rngs(3)))
    expected = [each(x) for each in layers]
    graphdef, params = nnx.split(layers)
    packed = pack_linear_weights(params)[0]

    def run_group(state, x):
        return apply_linears(nnx.merge(graphdef, state), x)

    for actual, reference in zip(jax.jit(run_group)(packed, x), expected, strict=True):
        np.testing.assert_allclose(actual, reference, rtol=1e-5, atol=1e-5)
    assert jax.jit(run_group).lower(packed, x).as_text().count("jaxgen_matmul_f32") == 1
    half = Linear(16, 48, bias=False, dtype=jnp.bfloat16, rngs=nnx.Rngs(1))
    assert pack_linear_weights(nnx.split(half)[1])[0]["kernel"][...].ndim == 2  # float32 only
    mixed = nnx.State({0: packed[0], 1: params[1]})  # one packed, one plain: each on its own
    for actual, reference in zip(jax.jit(run_group)(mixed, x), expected, strict=True):
        np.testing.assert_allclose(actual, reference, rtol=1e-5, atol=1e-5)
    assert jax.jit(run_group).lower(mixed, x).as_text().count("jaxgen_matmul_f32") == 1


def test_runner_packs_for_the_cpu_backend_only_and_output_matches(tiny_model_dir):
    from jaxgen import LLM, SamplingParams

    llm = LLM(tiny_model_dir, attention_backend="cpu", page_size=4, max_model_len=64)
    runner = llm.engine.runner
    layer = runner.step_params["layers"][0]["mlp"]["up_proj"]["kernel"].get_value()
    assert isinstance(layer, PackedWeight)  # packed for the step
    assert llm.params["layers"][0]["mlp"]["up_proj"]["kernel"][...].ndim == 2  # users see [in, out]
    if runner.config.tie_word_embeddings:
        assert isinstance(runner.head_kernel, PackedWeight)  # the tied LM head too
    reference = LLM(tiny_model_dir, attention_backend="reference", page_size=4, max_model_len=64)
    assert reference.engine.runner.step_params is reference.engine.runner.params
    prompts = [list(range(3, 3 + n)) for n in (5, 17, 33, 2)]
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    outputs = [
        [o.outputs[0].token_ids for o in engine.generate(prompts, params, use_tqdm=False)]
        for engine in (llm, reference)
    ]
    assert outputs[0] == outputs[1]


def test_tied_lm_head_packed_by_the_cpu_backend_runs_through_compute_logits():
    from jaxgen.backends.cpu import CPUBackend
    from jaxgen.config import ModelConfig
    from jaxgen.models import LlamaForCausalLM

    config = ModelConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        tie_word_embeddings=True,
    )
    graphdef, params = nnx.split(LlamaForCausalLM(config, rngs=nnx.Rngs(0)))
    step_params, head = CPUBackend().prepare_params(params, config)
    assert isinstance(head, PackedWeight) and head.shape == (32, 100)
    hidden = jnp.asarray(np.random.default_rng(4).standard_normal((6, 32)), jnp.float32)
    live = np.array([[0, 2], [3, 5]], np.int32)  # rows 2 and 5 are padding: zeros

    def logits(state, head, hidden, live):
        return nnx.merge(graphdef, state).compute_logits(hidden, head_kernel=head, live_rows=live)

    actual = np.asarray(jax.jit(logits)(step_params, head, hidden, live))
    expected = np.array(nnx.merge(graphdef, params).compute_logits(hidden))
    expected[[2, 5]] = 0
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
    lowered = jax.jit(logits).lower(step_params, head, hidden, live).as_text()
    assert lowered.count("jaxgen_matmul_f32") == 1
