"""8-bit KV pools (``kv_cache_dtype="int8" | "fp8"``): quantised on write, dequantised where
attention gathers; the same greedy tokens as one-at-a-time decoding over the same 8-bit pool
through chunked prefill, preemption and prefix reuse; smaller bytes per token; bad values."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgen import LLM, SamplingParams
from jaxgen.backends import select_backend
from jaxgen.config.engine_config import EngineConfig
from jaxgen.quantization import kv_cache

BACKENDS = ["reference"] + (["cpu"] if jax.default_backend() == "cpu" else [])


@pytest.mark.parametrize("dtype, tolerance", [("int8", 0.5 / 127), ("fp8", 2.0**-4)])
def test_write_then_gather_is_within_half_a_step(dtype, tolerance):
    rng = np.random.default_rng(0)
    pages = kv_cache.zeros(dtype, (2, 4, 8, 256), jnp.float32)  # [Hkv, P, S, D]
    scale = np.asarray([1.0] * 128 + [30.0] * 128)
    new = jnp.asarray(rng.standard_normal((5, 2, 256)) * scale, jnp.float32)
    slots = jnp.asarray([8, 9, 17, 31, 10], jnp.int32)
    pages = kv_cache.write(pages, new, slots)
    gathered = pages.gather(jnp.arange(4, dtype=jnp.int32))  # [Hkv, P, S, D]
    flat = np.asarray(gathered).reshape(2, 32, 256)[:, np.asarray(slots)].swapaxes(0, 1)
    # a 256-wide head has a scale per 128 elements: the small half keeps its precision
    bound = np.abs(np.asarray(new)).reshape(5, 2, 2, 128).max(-1, keepdims=True) * tolerance
    error = np.abs(flat - np.asarray(new)).reshape(5, 2, 2, 128)
    assert (error <= bound * 1.01 + 1e-7).all()


@pytest.mark.parametrize("dtype, storage", [("int8", "s8"), ("fp8", "u8")])
def test_write_converts_nothing_pool_sized(dtype, storage):
    """The compiled write touches the pool only in its stored types: a float8 pool was
    converted to float16 and back whole on every write (XLA:CPU), and a bfloat16 scale pool to
    float32, a cost in proportion to the pool; fp8 codes are therefore kept as uint8 bits and
    the bfloat16 scales as uint16 bits."""
    import re

    shape = (2, 512, 16, 64)  # [Hkv, P, S, D]
    pool = kv_cache.pool_shapes(dtype, shape, jnp.float32)
    assert pool.values.dtype == {"s8": jnp.int8, "u8": jnp.uint8}[storage]
    new = jax.ShapeDtypeStruct((8, 2, 64), jnp.float32)  # [T, Hkv, D]
    slots = jax.ShapeDtypeStruct((8,), jnp.int32)
    write = jax.jit(kv_cache.write, donate_argnums=0)
    text = write.trace(pool, new, slots).lower().compile().as_text()
    pool_sized = {
        element
        for element, dims in re.findall(r"(\w+)\[([\d,]+)\]", text)
        if np.prod([int(d) for d in dims.split(",")]) >= np.prod(shape)
    }
    assert pool_sized == {storage}, pool_sized
    scale_sized = {
        element
        for element, dims in re.findall(r"(\w+)\[([\d,]+)\]", text)
        if np.prod([int(d) for d in dims.split(",")]) >= np.prod(pool.scales.shape)
    }
    assert scale_sized == {storage, "u16"}, scale_sized


def _prompts(count=5):
    rng = np.random.default_rng(1)
    shared = rng.integers(0, 1000, 20).tolist()  # a full page shared by every prompt
    return [shared + rng.integers(0, 1000, int(n)).tolist() for n in (5, 12, 3, 9, 7)[:count]]


@pytest.mark.slow
@pytest.mark.parametrize(
    "dtype, backend",
    [("int8", "reference")]
    + [pytest.param(d, b, marks=pytest.mark.slow) for d in ("int8", "fp8") for b in BACKENDS][1:],
)
def test_batching_modes_match_one_at_a_time(tiny_model_dir, dtype, backend):
    from jaxgen.loaders import load_model

    loaded = load_model(tiny_model_dir)
    prompts = _prompts()
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    knobs = dict(max_model_len=64, kv_cache_dtype=dtype, attention_backend=backend)
    reference = [
        o.token_ids
        for o in LLM(loaded, batching="none", **knobs).generate(prompts, params, use_tqdm=False)
    ]
    float_pool = LLM(loaded, batching="none", max_model_len=64, attention_backend=backend)
    float_tokens = [o.token_ids for o in float_pool.generate(prompts, params, use_tqdm=False)]
    # Not garbage: on this random tiny model one flipped near-tie sends a greedy sequence its
    # own way for good (fp8 flips one by token 4-17), so compare the first four tokens.
    assert np.mean(np.asarray(reference)[:, :4] == np.asarray(float_tokens)[:, :4]) > 0.5

    chunked = LLM(loaded, max_rolling_batch_prefill_tokens=16, max_rolling_batch_size=4, **knobs)
    assert [o.token_ids for o in chunked.generate(prompts, params, use_tqdm=False)] == reference

    page_bytes = chunked.stats()["kv_bytes_per_token"] * 16
    tiny = LLM(loaded, kv_cache_memory=6 * page_bytes, enable_prefix_caching=False, **knobs)
    assert [o.token_ids for o in tiny.generate(prompts, params, use_tqdm=False)] == reference
    assert tiny.stats()["preemptions"] > 0

    reuse = LLM(loaded, **knobs)
    first = reuse.generate(prompts[:1], params, use_tqdm=False)
    rest = reuse.generate(prompts[1:], params, use_tqdm=False)
    assert [o.token_ids for o in first + rest] == reference
    assert reuse.stats()["prefix_cache_hit_pages"] >= len(prompts) - 1


def test_bytes_per_token(tiny_model_dir):
    from jaxgen.loaders import load_model

    loaded = load_model(tiny_model_dir)
    stats = {
        dtype: LLM(loaded, max_model_len=64, kv_cache_dtype=dtype).stats()
        for dtype in ("auto", "int8", "fp8")
    }
    head_dim = loaded.config.head_dim
    assert head_dim <= 128
    # float32 values; one byte per code plus one bfloat16 scale per head
    per_head = {"auto": 4 * head_dim, "int8": head_dim + 2, "fp8": head_dim + 2}
    for dtype, row in stats.items():
        expected = 2 * loaded.config.num_layers * loaded.config.num_kv_heads * per_head[dtype]
        assert row["kv_bytes_per_token"] == expected
        assert row["kv_cache_dtype"] == dtype


@pytest.mark.parametrize("value", ["int4", "float8", None])
def test_bad_kv_cache_dtype_names_value_and_choices(value):
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be one of 'auto', 'int8', 'fp8'"):
        EngineConfig(kv_cache_dtype=value)
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be one of"):
        select_backend("reference", kv_cache_dtype=value)


def test_every_backend_takes_8bit_pools():
    for name in ("reference", "pallas-tpu", "pallas-gpu"):
        assert select_backend(name, kv_cache_dtype="fp8").kv_cache_dtype == "fp8"
    tpu = select_backend("pallas-tpu", kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="page_size=32: an 8-bit TPU pool needs a multiple of 128"):
        tpu.kv_pool_shapes(_Config, 4, 32, jnp.float32)


class _Config:
    num_layers, num_kv_heads, head_dim = 1, 2, 64


def test_planner_counts_quantised_bytes(tiny_model_dir):
    from jaxgen.config import ModelConfig
    from jaxgen.loaders.hf_checkpoint import load_hf_config
    from jaxgen.planning.capacity import make_plan
    from jaxgen.planning.hardware import DEVICES

    config: ModelConfig = load_hf_config(tiny_model_dir)
    base = make_plan(config, device=DEVICES["h100"], dtype="bfloat16")
    small = make_plan(
        config, device=DEVICES["h100"], dtype="bfloat16", quantization="int8", kv_cache_dtype="int8"
    )
    assert small.kv_bytes_per_token == kv_cache.bytes_per_token(config)
    assert small.kv_bytes_per_token < base.kv_bytes_per_token
    assert small.weight_bytes == int(config.num_params * (1 + 2 / 32))
    assert small.num_pages > base.num_pages


def test_planner_counts_each_devices_share_of_an_8bit_pool(tiny_model_dir):
    """Under tensor parallelism the pages are bounded by one device's share of each page: half
    of the 2 KV heads' codes and scales at degree 2; at degree 4 the paired pool holds both
    heads on every device (the degree does not divide them), the TPU pool one head per chip."""
    from jaxgen.loaders.hf_checkpoint import load_hf_config
    from jaxgen.planning.capacity import make_plan
    from jaxgen.planning.hardware import DEVICES

    config = load_hf_config(tiny_model_dir)  # 2 KV heads
    int8 = kv_cache.bytes_per_token(config)
    plans = {
        (device, degree): make_plan(
            config,
            device=DEVICES[device],
            tensor_parallel_degree=degree,
            kv_cache_dtype="int8",
            memory_utilization=0.5,
        )
        for device in ("h100", "tpu-v5e")
        for degree in (1, 2, 4)
    }
    per_device = {key: plan.kv_bytes_per_token_per_device for key, plan in plans.items()}
    assert per_device == {
        ("h100", 1): int8,
        ("h100", 2): int8 // 2,
        ("h100", 4): int8,
        ("tpu-v5e", 1): int8,
        ("tpu-v5e", 2): int8 // 2,
        ("tpu-v5e", 4): int8 // 2,
    }
    for (device, degree), plan in plans.items():
        assert plan.kv_bytes_per_token_windowed == pytest.approx(int8)  # no sliding layers
        per_device_budget = plan.kv_budget_bytes // degree
        assert plan.num_pages == per_device_budget // (per_device[device, degree] * 16)
    # Doubling the devices doubles the pages when the heads split, not when they are replicated.
    assert plans["h100", 2].num_pages > 1.9 * plans["h100", 1].num_pages
    assert plans["h100", 4].num_pages < plans["h100", 2].num_pages
