"""A model family added from outside the package: a test registers "toylm" (a Llama with its
own ``config.json`` keys, its own tensor names and a GGUF architecture of its own) with
``jaxgen.families.register_family`` and nothing else, and it loads from safetensors and GGUF,
shards, and generates what transformers' Llama generates from the same weights."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from flax import nnx

from jaxgen import LLM, SamplingParams
from jaxgen.evaluation.full_forward import full_sequence_logits
from jaxgen.families import ModelFamily, family_of, register_family, unregister_family
from jaxgen.families.checkpoint_names import torch_layout
from jaxgen.families.gguf_names import gguf_tensor_name
from jaxgen.families.hf_fields import decoder_fields
from jaxgen.layers.sharding import logical_axes
from jaxgen.loaders import load_model
from tests.family_models import hf_greedy_tokens, save_tiny_model
from tests.loaders.test_gguf_families import copy_tokenizer

# Our (Llama) module path -> toylm's, within a layer.
TOY_LAYER = {
    "self_attn.q_proj": "attn.wq",
    "self_attn.k_proj": "attn.wk",
    "self_attn.v_proj": "attn.wv",
    "self_attn.o_proj": "attn.wo",
    "mlp.gate_proj": "ffn.w1",
    "mlp.up_proj": "ffn.w3",
    "mlp.down_proj": "ffn.w2",
    "input_layernorm": "norm1",
    "post_attention_layernorm": "norm2",
}
TOY_TOP = {"embed_tokens": "tok", "norm": "final_norm", "lm_head": "head"}
# toylm config key -> the Llama key it stands for.
TOY_KEYS = {
    "d_model": "hidden_size",
    "d_ff": "intermediate_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "vocab": "vocab_size",
    "eps": "rms_norm_eps",
}


def toy_fields(hf: dict) -> dict:
    llama_keys = {TOY_KEYS.get(key, key): value for key, value in hf.items()}
    return decoder_fields(llama_keys, "toylm")


def toy_name(path: tuple) -> str:
    if path[0] in TOY_TOP:
        return f"{TOY_TOP[path[0]]}.weight"
    module = ".".join(str(p) for p in path[2:-1])
    return f"blocks.{path[1]}.{TOY_LAYER[module]}.weight"


def toy_read(config, path: tuple, get) -> np.ndarray:
    return torch_layout(path, np.asarray(get(toy_name(path))))


def llama_path(hf_name: str) -> tuple:
    """Our parameter path of a Llama-named HF tensor."""
    parts = hf_name.removeprefix("model.").split(".")
    return tuple(int(p) if p.isdigit() else p for p in parts[:-1]) + ("kernel",)


def toy_gguf_name(name: str, gguf_names: set[str]) -> str:
    """llama.cpp's names (``blk.0.attn_q.weight``) to toylm's."""
    return toy_name(llama_path(gguf_tensor_name(name, gguf_names)))


TOY = ModelFamily(
    model_type="toylm",
    architectures=("ToyLMForCausalLM",),
    config_fields=toy_fields,
    read_parameter=toy_read,
    direct_name=lambda config, path: toy_name(path),
    gguf_architecture="toylm",
    gguf_tensor_name=toy_gguf_name,
)


@pytest.fixture(scope="module")
def toy_family():
    register_family(TOY)
    yield TOY
    unregister_family("toylm")


@pytest.fixture(scope="module")
def llama_and_toy(tmp_path_factory, smollm2_tokenizer):
    """A tiny random Llama checkpoint, and the same weights saved as a toylm checkpoint."""
    from safetensors.numpy import load_file, save_file

    llama = save_tiny_model(str(tmp_path_factory.mktemp("llama")), smollm2_tokenizer)
    toy = str(tmp_path_factory.mktemp("toylm"))
    with open(os.path.join(llama, "config.json")) as f:
        hf = json.load(f)
    llama_keys = {value: key for key, value in TOY_KEYS.items()}
    config = {llama_keys.get(key, key): value for key, value in hf.items()}
    config.update(model_type="toylm", architectures=["ToyLMForCausalLM"])
    with open(os.path.join(toy, "config.json"), "w") as f:
        json.dump(config, f)
    renamed = {}
    for name, array in load_file(os.path.join(llama, "model.safetensors")).items():
        renamed[toy_name(llama_path(name))] = array
    save_file(renamed, os.path.join(toy, "model.safetensors"))
    smollm2_tokenizer.save_pretrained(toy)
    return llama, toy


def test_a_registered_family_loads_and_matches_transformers(toy_family, llama_and_toy):
    llama_dir, toy_dir = llama_and_toy
    toy, llama = load_model(toy_dir), load_model(llama_dir)
    assert toy.config.model_type == "toylm" and family_of("toylm") is toy_family
    ids = np.random.default_rng(0).integers(0, toy.config.vocab_size, 19).tolist()
    np.testing.assert_array_equal(full_sequence_logits(toy, ids), full_sequence_logits(llama, ids))
    for path, _ in nnx.to_flat_state(toy.params):
        logical_axes(path)  # every parameter has its sharding axes
    prompts = [[5, 17, 230, 9], [44, 3, 81, 12, 7, 300]]
    expected = hf_greedy_tokens(llama_dir, prompts, 8)
    llm = LLM(toy, max_model_len=64)
    outputs = llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0))
    assert [list(o.outputs[0].token_ids) for o in outputs] == expected


def test_a_registered_family_loads_from_gguf(toy_family, llama_and_toy, tmp_path, smollm2_gguf):
    """The family's ``gguf_architecture`` with the default (Llama-named, unpermuted) tensors."""
    import gguf
    from safetensors.numpy import load_file

    llama_dir, _ = llama_and_toy
    with open(os.path.join(llama_dir, "config.json")) as f:
        hf = json.load(f)
    out = str(tmp_path / "toylm.gguf")
    writer = gguf.GGUFWriter(out, "toylm")
    for key, value in (
        ("context_length", hf["max_position_embeddings"]),
        ("embedding_length", hf["hidden_size"]),
        ("block_count", hf["num_hidden_layers"]),
        ("feed_forward_length", hf["intermediate_size"]),
        ("attention.head_count", hf["num_attention_heads"]),
        ("attention.head_count_kv", hf["num_key_value_heads"]),
    ):
        writer.add_uint32(f"toylm.{key}", value)
    writer.add_float32("toylm.attention.layer_norm_rms_epsilon", hf["rms_norm_eps"])
    copy_tokenizer(writer, smollm2_gguf)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, hf["num_hidden_layers"])
    for name, array in load_file(os.path.join(llama_dir, "model.safetensors")).items():
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight",)), array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    loaded = load_model(out, quantization="none")
    assert loaded.config.model_type == "toylm"
    ids = [5, 17, 230, 9, 44, 3]
    reference = full_sequence_logits(load_model(llama_dir), ids)
    np.testing.assert_allclose(full_sequence_logits(loaded, ids), reference, atol=1e-5)


def test_an_unregistered_family_is_refused_by_name(toy_family, llama_and_toy):
    _, toy_dir = llama_and_toy
    unregister_family("toylm")
    try:
        with pytest.raises(ValueError, match="ToyLMForCausalLM"):
            load_model(toy_dir)
    finally:
        register_family(TOY)
