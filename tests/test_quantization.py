"""Quantised weights: ``QuantizedWeight`` against the float weight it stands for, quantising at
load, GGUF tensors kept quantised with the file's exact values, the ``quantization`` knob."""

from __future__ import annotations

import logging

import jax.numpy as jnp
import numpy as np
import pytest

from jaxgen.engine.engine_config import EngineConfig
from jaxgen.loaders.gguf_loader import GGUFFile
from jaxgen.models.linear import matmul
from jaxgen.quantization import (
    QuantizationSpec,
    QuantizedWeight,
    pack_int4,
    quantize_kernel,
    unpack_int4,
)


def _weight(depth=256, columns=48, seed=0):
    return np.random.default_rng(seed).standard_normal((depth, columns)).astype(np.float32) * 0.05


@pytest.mark.parametrize(
    "spec, tolerance",
    [
        (QuantizationSpec(kind="int8"), 0.5 / 127),  # half a step of the column's max
        (QuantizationSpec(kind="int8", group_size=32), 0.5 / 127),
        (QuantizationSpec(kind="int4", group_size=32), 0.5 / 7),
        (QuantizationSpec(kind="int4", group_size=128), 0.5 / 7),
        (QuantizationSpec(kind="int4", group_size=32, asymmetric=True), 0.5 / 15 * 2),
        (QuantizationSpec(kind="fp8"), 2.0**-4),  # e4m3: 3 mantissa bits
    ],
)
def test_quantize_then_dequantize_is_within_half_a_step(spec, tolerance):
    w = _weight()
    q = quantize_kernel(w, spec)
    group = spec.group_size or w.shape[0]
    blocks = np.abs(w).reshape(-1, group, w.shape[1]).max(axis=1)  # [G, N]
    bound = np.repeat(blocks, group, axis=0) * tolerance * 1.01 + 1e-7
    error = np.abs(np.asarray(q.dequantize()) - w)
    assert (error <= bound).all(), error.max()
    assert q.shape == w.shape


def test_matmul_is_x_times_dequantized_weight():
    w = _weight()
    q = quantize_kernel(w, QuantizationSpec(kind="int4", group_size=32, asymmetric=True))
    x = jnp.asarray(np.random.default_rng(1).standard_normal((5, 256)), jnp.float32)
    expected = np.asarray(x, np.float64) @ np.asarray(q.dequantize(), np.float64)
    np.testing.assert_allclose(np.asarray(matmul(x, q)), expected, rtol=1e-5, atol=1e-5)


def test_take_columns_is_the_embedding_lookup():
    w = _weight()
    q = quantize_kernel(w, QuantizationSpec(kind="int8"))
    ids = jnp.asarray([3, 0, 47, 3], jnp.int32)
    np.testing.assert_array_equal(q.take_columns(ids), np.asarray(q.dequantize()).T[[3, 0, 47, 3]])


def test_int4_packing_round_trips():
    codes = np.random.default_rng(2).integers(0, 16, (64, 9)).astype(np.uint8)
    packed = pack_int4(codes)
    assert packed.shape == (32, 9)
    np.testing.assert_array_equal(unpack_int4(packed), codes)


@pytest.mark.parametrize("group", [0, 3, 48, 100])
def test_group_size_must_divide_the_input_width(group):
    with pytest.raises(ValueError, match=f"group_size {group}"):
        quantize_kernel(_weight(), QuantizationSpec(kind="int4", group_size=group))


def test_unknown_kind_names_the_choices():
    with pytest.raises(ValueError, match="'int3'.*|.*int3"):
        QuantizedWeight(
            np.zeros((4, 4), np.int8), np.ones((1, 4)), None, kind="int3", group_size=4,
            shape=(4, 4),
        )  # fmt: skip


@pytest.mark.parametrize("value", ["int3", "q4", None, "INT8"])
def test_unknown_quantization_value_names_value_and_choices(value):
    with pytest.raises(ValueError, match=r"quantization must be one of 'auto', 'none', 'int8'"):
        EngineConfig(quantization=value)


def write_gguf(path, tensors: dict, qtype_name: str) -> str:
    """A GGUF holding ``tensors`` ({gguf name: [out, in] float32}) in ``qtype_name``."""
    import gguf

    qtype = gguf.GGMLQuantizationType[qtype_name]
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    for name, data in tensors.items():
        writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_gguf_tensor_kept_quantised_has_the_files_values(tmp_path, qtype):
    rng = np.random.default_rng(3)
    tensors = {
        "blk.0.attn_q.weight": rng.standard_normal((64, 96)).astype(np.float32),  # rotary rows
        "blk.0.ffn_up.weight": rng.standard_normal((40, 64)).astype(np.float32),
    }
    gguf_file = GGUFFile(write_gguf(str(tmp_path / f"{qtype}.gguf"), tensors, qtype))
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight"):
        quantized = gguf_file.get_quantized(name)
        assert quantized.kind == ("int8" if qtype == "Q8_0" else "int4")
        assert quantized.group_size == 32 and (quantized.mins is not None) == (qtype == "Q4_1")
        np.testing.assert_array_equal(quantized.dequantize(), gguf_file.get_tensor(name).T)


def test_other_gguf_types_are_requantised_with_a_log_line(tmp_path, caplog):
    tensors = {"blk.0.ffn_up.weight": np.random.default_rng(4).standard_normal((8, 64))}
    tensors = {k: v.astype(np.float32) for k, v in tensors.items()}
    gguf_file = GGUFFile(write_gguf(str(tmp_path / "q5.gguf"), tensors, "Q5_0"))
    with caplog.at_level(logging.INFO, logger="jaxgen.loaders.gguf_loader"):
        quantized = gguf_file.get_quantized("model.layers.0.mlp.up_proj.weight")
    assert quantized.kind == "int8" and "Q5_0: dequantised and requantised to int8" in caplog.text
    expected = gguf_file.get_tensor("model.layers.0.mlp.up_proj.weight").T
    np.testing.assert_allclose(quantized.dequantize(), expected, atol=np.abs(expected).max() / 200)


def test_serve_quantization_from_flags_env_and_properties(tmp_path):
    from serving.setting_parsers import SettingsError
    from serving.settings import resolve_settings

    assert resolve_settings({"quantization": "int4"}, {}).engine["quantization"] == "int4"
    assert resolve_settings({}, {"QUANTIZE": "eetq"}).engine["quantization"] == "int8"  # TGI
    assert resolve_settings({}, {"QUANTIZE": "fp8"}).engine["quantization"] == "fp8"
    properties = tmp_path / "serving.properties"
    properties.write_text("option.quantize=bitsandbytes8\n")  # LMI
    assert resolve_settings({}, {}, str(properties)).engine["quantization"] == "int8"
    with pytest.raises(SettingsError, match=r"quantization from environment .* got 'gptq'"):
        resolve_settings({}, {"QUANTIZE": "gptq"})


def test_serve_bad_quantization_flag_is_one_line_and_exit_2():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "serving", "--quantization", "int3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if "quantization" in line]
    assert len(lines) == 1 and "must be one of auto, none, int8, int4, fp8" in lines[0]
    assert lines[0].endswith("got 'int3'")


def test_serve_kv_cache_dtype_setting():
    from serving.setting_parsers import SettingsError
    from serving.settings import resolve_settings

    assert resolve_settings({"kv_cache_dtype": "fp8"}, {}).engine["kv_cache_dtype"] == "fp8"
    with pytest.raises(SettingsError, match=r"kv_cache_dtype from flags .* got 'int4'"):
        resolve_settings({"kv_cache_dtype": "int4"}, {})
