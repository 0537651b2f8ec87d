"""Quantised weights: ``QuantizedWeight`` against the float weight it stands for, quantising at
load, GGUF tensors kept quantised with the file's exact values, int8 activations (W8A8), the
``quantization`` knob."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxgen.config.engine_config import EngineConfig
from jaxgen.layers.linear import matmul
from jaxgen.loaders.gguf_loader import GGUFFile
from jaxgen.quantization import (
    QuantizationSpec,
    QuantizedWeight,
    pack_int4,
    quantize_kernel,
    spec_for_path,
    unpack_int4,
)
from jaxgen.quantization.quantized_weight import fake_quantize_activations, quantize_activations


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


def test_activation_codes_are_per_row_and_32_columns():
    """int8 codes in [-127, 127], the largest of each group at +-127, round half to even, an
    all-zero group at scale 0; the fake-quantised x is within half a step of x."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 96)).astype(np.float32) * rng.uniform(0.01, 100, (3, 1))
    x[1, 32:64] = 0.0
    x[2, :32] = np.arange(-16, 16) + 0.5  # the group's max is 127 (below): x * 127 / max = x
    x[2, 31] = 127.0
    codes, scales = quantize_activations(jnp.asarray(x))
    codes, scales = np.asarray(codes), np.asarray(scales)
    assert codes.dtype == np.int8 and scales.shape == (3, 3)
    groups = np.abs(x).reshape(3, 3, 32).max(axis=-1)
    np.testing.assert_allclose(scales, groups / 127, rtol=1e-7)
    assert (np.abs(codes).reshape(3, 3, 32).max(axis=-1) == np.where(groups > 0, 127, 0)).all()
    assert scales[1, 1] == 0 and (codes[1, 32:64] == 0).all()
    np.testing.assert_array_equal(codes[2, :31], np.round(x[2, :31]))  # halves to even
    assert list(codes[2, 14:18]) == [-2, 0, 0, 2]  # -1.5, -0.5, 0.5, 1.5
    error = np.abs(np.asarray(fake_quantize_activations(jnp.asarray(x))) - x)
    assert (error <= np.repeat(scales, 32, axis=1) * 0.5001 + 1e-12).all()


def test_w8a8_weights_quantise_their_input():
    """``quantization="w8a8"``: int8 groups of 32 with int8 activations for every kernel and
    the head; its matmul is the fake-quantised x times the dequantised weight."""
    spec = spec_for_path("w8a8", ("layers", 0, "mlp", "down_proj", "kernel"))
    assert spec == QuantizationSpec(kind="int8", group_size=32, activations="int8")
    assert spec_for_path("w8a8", ("embed_tokens", "embedding")) == spec
    assert spec_for_path("int8", ("lm_head", "kernel")).activations == "int16"
    w = quantize_kernel(_weight(), spec)
    assert w.activations == "int8"
    x = jnp.asarray(np.random.default_rng(3).standard_normal((4, 256)), jnp.float32)
    expected = np.asarray(fake_quantize_activations(x), np.float64) @ np.asarray(
        w.dequantize(), np.float64
    )
    np.testing.assert_allclose(np.asarray(matmul(x, w)), expected, rtol=1e-5, atol=1e-5)


def test_w4a8_quantises_kernels_to_int4_and_the_head_to_int8_with_int8_activations():
    """``quantization="w4a8"`` on a float checkpoint: asymmetric int4 groups of 32 (the head
    and embedding int8), every one taking int8 activations; matmul as w8a8's reference."""
    spec = spec_for_path("w4a8", ("layers", 0, "mlp", "down_proj", "kernel"))
    assert spec == QuantizationSpec(kind="int4", group_size=32, asymmetric=True, activations="int8")
    head = QuantizationSpec(kind="int8", group_size=32, activations="int8")
    assert spec_for_path("w4a8", ("lm_head", "kernel")) == head
    assert spec_for_path("w4a8", ("embed_tokens", "embedding")) == head
    w = quantize_kernel(_weight(), spec)
    assert (w.kind, w.activations) == ("int4", "int8")
    x = jnp.asarray(np.random.default_rng(5).standard_normal((3, 256)), jnp.float32)
    expected = np.asarray(fake_quantize_activations(x), np.float64) @ np.asarray(
        w.dequantize(), np.float64
    )
    np.testing.assert_allclose(np.asarray(matmul(x, w)), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kind, shape, group, activations, message",
    [
        ("fp8", (64, 8), 32, "int8", "int8 activations need an int8 or int4 weight"),
        ("int4", (64, 8), 32, "int16", "int16 activations need an int8 weight"),
        ("int4", (48, 8), 16, "int8", "multiples of 32"),
        ("int8", (48, 8), 16, "int8", "multiples of 32"),
        ("int8", (64, 8), 32, "int4", "activations must be one of"),
    ],
)
def test_integer_activations_need_integer_weights_in_groups_of_32(
    kind, shape, group, activations, message
):
    with pytest.raises(ValueError, match=message):
        quantize_kernel(
            _weight(*shape), QuantizationSpec(kind=kind, group_size=group, activations=activations)
        )


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


def test_serve_quantization_from_flags_env_and_properties(tmp_path):
    from serving.settings.parsers import SettingsError
    from serving.settings.resolve import resolve_settings

    assert resolve_settings({"quantization": "int4"}, {}).engine["quantization"] == "int4"
    assert resolve_settings({}, {"QUANTIZE": "eetq"}).engine["quantization"] == "int8"  # TGI
    assert resolve_settings({}, {"QUANTIZE": "fp8"}).engine["quantization"] == "fp8"
    assert resolve_settings({"quantization": "w4a8"}, {}).engine["quantization"] == "w4a8"
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
    assert len(lines) == 1 and "must be one of auto, none, int8, int4, fp8, w8a8" in lines[0]
    assert lines[0].endswith("got 'int3'")


def test_serve_kv_cache_dtype_setting():
    from serving.settings.parsers import SettingsError
    from serving.settings.resolve import resolve_settings

    assert resolve_settings({"kv_cache_dtype": "fp8"}, {}).engine["kv_cache_dtype"] == "fp8"
    with pytest.raises(SettingsError, match=r"kv_cache_dtype from flags .* got 'int4'"):
        resolve_settings({"kv_cache_dtype": "int4"}, {})


@pytest.mark.parametrize("quantization, kind", [("w8a8", "int8"), ("w4a8", "int4")])
def test_integer_activation_engine_gives_each_request_the_same_tokens_alone_and_batched(
    tiny_model_dir, quantization, kind
):
    """``quantization="w8a8"`` / ``"w4a8"`` through the engine on both CPU paths (the native
    kernels and XLA's reference): x is quantised per row, so a request's greedy tokens do not
    depend on the batch it shares a step with."""
    from jaxgen import LLM, SamplingParams

    prompts = [list(range(100, 140)), list(range(7, 30)), list(range(300, 303))]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    for backend in ("auto", "reference"):
        llm = LLM(
            tiny_model_dir,
            quantization=quantization,
            max_model_len=128,
            kv_cache_memory=4 << 20,
            attention_backend=backend,
        )
        kinds = llm.stats()["weight_dtypes"]
        quantized = [name for name in kinds if name.startswith(kind)]
        assert quantized and all(name.endswith("/a8") for name in quantized), kinds
        batched = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        alone = [llm.generate([p], params, use_tqdm=False)[0].token_ids for p in prompts]
        assert batched == alone and all(len(tokens) == 8 for tokens in batched)
