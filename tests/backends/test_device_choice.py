"""What ``auto`` picks per device, and what a device refuses, from descriptions alone (no GPU):
below compute capability 8.0 no Triton kernel and float16, above it pallas-gpu and bfloat16;
the engine refuses what the device cannot run before any weights load."""

from __future__ import annotations

import types

import jax.numpy as jnp
import pytest

from jaxgen.backends import resolve_backend_name, select_backend
from jaxgen.backends.device_choice import (
    DeviceDescription,
    auto_attention_backend,
    auto_dtype,
    check_device_support,
    parse_compute_capability,
)
from jaxgen.config.engine_config import EngineConfig
from jaxgen.create_engine import create_engine, engine_dtype

T4 = DeviceDescription("gpu", (7, 5), "Tesla T4")
V100 = DeviceDescription("gpu", (7, 0), "Tesla V100-SXM2-16GB")
A100 = DeviceDescription("gpu", (8, 0), "NVIDIA A100-SXM4-80GB")
L4 = DeviceDescription("gpu", (8, 9), "NVIDIA L4")
H100 = DeviceDescription("gpu", (9, 0), "NVIDIA H100 80GB HBM3")
TPU = DeviceDescription("tpu")
CPU = DeviceDescription("cpu")


@pytest.mark.parametrize(
    "device, backend, dtype",
    [
        (T4, "reference", jnp.float16),
        (V100, "reference", jnp.float16),
        (A100, "pallas-gpu", jnp.bfloat16),
        (L4, "pallas-gpu", jnp.bfloat16),
        (H100, "pallas-gpu", jnp.bfloat16),
        (DeviceDescription("gpu"), "pallas-gpu", jnp.bfloat16),  # capability unknown
        (TPU, "pallas-tpu", jnp.bfloat16),
        (CPU, "cpu", jnp.float32),
    ],
    ids=["t4", "v100", "a100", "l4", "h100", "gpu-unknown", "tpu", "cpu"],
)
def test_auto_picks_per_device(device, backend, dtype):
    assert auto_attention_backend(device, dtype=dtype, cpu_kernels=True) == backend
    assert auto_dtype(device) is dtype
    assert resolve_backend_name("auto", dtype=dtype, device=device) in (backend, "reference")
    check_device_support(device, dtype=dtype, attention_backend="auto")  # auto always runs


def test_families_float16_overflows_take_float32_without_bfloat16():
    assert auto_dtype(T4, "gemma3_text") is jnp.float32 and auto_dtype(T4, "gemma2") is jnp.float32
    assert (
        auto_dtype(T4, "llama") is jnp.float16 and auto_dtype(A100, "gemma3_text") is jnp.bfloat16
    )


def test_load_model_auto_dtype_follows_the_family(monkeypatch, tmp_path, smollm2_tokenizer):
    """``load_model(dtype="auto")`` (what notebooks call) on a T4: a Gemma 2 loads in float32,
    a Llama in float16, as the engine's own ``dtype="auto"`` picks."""
    import jaxgen.loaders
    from tests.family_models import save_family_model, save_tiny_model

    monkeypatch.setattr(jaxgen.loaders, "local_device", lambda: T4)
    gemma = save_family_model(str(tmp_path / "gemma2"), smollm2_tokenizer, "gemma2")
    llama = save_tiny_model(str(tmp_path / "llama"), smollm2_tokenizer)
    assert jaxgen.loaders.load_model(gemma, dtype="auto").dtype is jnp.float32
    assert jaxgen.loaders.load_model(llama, dtype="auto").dtype is jnp.float16


def test_cpu_auto_falls_back_to_reference():
    assert auto_attention_backend(CPU, dtype=jnp.bfloat16, cpu_kernels=True) == "reference"
    assert auto_attention_backend(CPU, sharded=True, cpu_kernels=True) == "reference"
    assert auto_attention_backend(CPU, cpu_kernels=False) == "reference"


@pytest.mark.parametrize("name", ["pallas-gpu", "pallas"])
def test_triton_backends_are_refused_below_ampere(name):
    with pytest.raises(
        ValueError, match=rf"attention_backend={name!r}.*Tesla T4 \(compute capability 7.5\)"
    ):
        check_device_support(T4, dtype="float16", attention_backend=name)
    with pytest.raises(ValueError, match="attention_backend"):
        select_backend(name, dtype=jnp.float16, device=T4)
    assert resolve_backend_name(name, device=A100) == "pallas-gpu"


def test_reference_backend_runs_on_a_t4():
    backend = select_backend("auto", dtype=jnp.float16, device=T4, kv_cache_dtype="int8")
    assert backend.name == "reference" and backend.kv_cache_dtype == "int8"


@pytest.mark.parametrize("dtype", ["bfloat16", jnp.bfloat16])
def test_bfloat16_is_refused_below_ampere(dtype):
    with pytest.raises(ValueError, match=r"^dtype='bfloat16': a Tesla T4 .*float16"):
        check_device_support(T4, dtype=dtype, attention_backend="auto")
    for ok in ("float16", "float32", "auto", jnp.float16):
        check_device_support(T4, dtype=ok, attention_backend="reference")
    check_device_support(A100, dtype=dtype, attention_backend="pallas-gpu")
    check_device_support(CPU, dtype=dtype, attention_backend="auto")


def test_the_engine_refuses_before_loading_anything(tmp_path):
    """A model path that does not exist: a load would fail naming the path, so the device's
    ValueError proves the check comes first."""
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(ValueError, match="^dtype="):
        create_engine(missing, dtype="bfloat16", config=EngineConfig(), device=T4)
    config = EngineConfig(attention_backend="pallas-gpu")
    with pytest.raises(ValueError, match="^attention_backend="):
        create_engine(missing, dtype="float16", config=config, device=T4)
    allowed = EngineConfig(attention_backend="reference")
    with pytest.raises(Exception) as error:  # allowed choices go on to the load, which fails
        create_engine(missing, dtype="float16", config=allowed, device=T4)
    assert "no-such-model" in str(error.value)


def test_engine_dtype_reads_the_family_only_where_it_matters(tmp_path):
    (tmp_path / "config.json").write_text(
        '{"model_type": "gemma3_text", "vocab_size": 256, "hidden_size": 64, '
        '"intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2, '
        '"num_key_value_heads": 1, "head_dim": 32}'
    )
    assert engine_dtype(str(tmp_path), "auto", T4) == "float32"
    assert engine_dtype(str(tmp_path / "never-read"), "auto", A100) == "bfloat16"
    assert engine_dtype(str(tmp_path / "never-read"), "float16", T4) == "float16"


@pytest.mark.parametrize(
    "text, capability",
    [("7.5", (7, 5)), ("8.9", (8, 9)), ("10.0", (10, 0)), ("gfx90a", None), (None, None)],
)
def test_compute_capability_is_read_from_the_jax_device(text, capability):
    assert parse_compute_capability(text) == capability
    device = types.SimpleNamespace(platform="gpu", compute_capability=text, device_kind="GPU")
    assert DeviceDescription.from_jax_device(device).compute_capability == capability
    tpu = types.SimpleNamespace(platform="tpu", device_kind="TPU v5 lite")
    assert DeviceDescription.from_jax_device(tpu) == DeviceDescription("tpu", None, "TPU v5 lite")
    assert DeviceDescription("cuda").platform == "gpu"
