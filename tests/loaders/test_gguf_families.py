"""GGUF round trip for every family llama.cpp exports: a tiny HF checkpoint written as llama.cpp's
converter lays it out (its tensor-name map from the ``gguf`` package, its metadata keys, Gemma's
norm weights stored plus one, Llama's rotary and Falcon's QKV row orders) loads to the same
parameters and logits as the safetensors load."""

from __future__ import annotations

import json
import math
import os
import re

import numpy as np
import pytest
from flax import nnx

from jaxgen.evaluation.full_forward import full_sequence_logits
from jaxgen.loaders import load_model
from tests.family_models import save_family_model

TOKENIZER_FIELDS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.chat_template",
)
GGUF_ARCH = {
    "qwen3": "qwen3",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
    "phi3": "phi3",
    "qwen3_moe": "qwen3moe",
    "mixtral": "llama",
    "falcon": "falcon",
}


def copy_tokenizer(writer, source_gguf: str) -> None:
    """The SmolLM2 tokenizer's metadata (the checkpoints use its vocabulary)."""
    import gguf

    reader = gguf.GGUFReader(source_gguf)
    for key in TOKENIZER_FIELDS:
        field = reader.fields.get(key)
        if field is None:
            continue
        value = field.contents()
        main = field.types[0]
        sub = field.types[-1] if main == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, main, sub_type=sub)


def llama_cpp_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """The converter's rotary permutation of Llama's q/k rows (rotate-half to interleaved)."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def stack_experts(tensors: dict) -> dict:
    """``...experts.E.gate_proj.weight`` tensors merged into ``...experts.gate_proj.weight``
    ``[E, out, in]``, as the converter writes MoE layers."""
    out, experts = {}, {}
    for name, array in tensors.items():
        match = re.fullmatch(r"(.*\.experts)\.(\d+)\.(\w+\.weight)", name)
        if match is None:
            out[name] = array
        else:
            experts.setdefault(f"{match[1]}.{match[3]}", {})[int(match[2])] = array
    for name, by_index in experts.items():
        out[name] = np.stack([by_index[i] for i in sorted(by_index)])
    return out


def llama_cpp_falcon_qkv(weights: np.ndarray, hf: dict) -> np.ndarray:
    """The converter's Falcon QKV reorder: per KV head (its query heads, one key, one value) to
    all query heads, all key heads, all value heads."""
    heads, kv_heads = hf["num_attention_heads"], hf.get("num_kv_heads") or 1
    head_dim = hf["hidden_size"] // heads
    grouped = weights.reshape(kv_heads, heads // kv_heads + 2, head_dim, -1)
    q = grouped[:, :-2].reshape(heads * head_dim, -1)
    k = grouped[:, -2].reshape(kv_heads * head_dim, -1)
    v = grouped[:, -1].reshape(kv_heads * head_dim, -1)
    return np.concatenate([q, k, v]).reshape(weights.shape)


def write_falcon_header(writer, hf: dict) -> None:
    """The converter's Falcon metadata: a fixed 2048 context and ``4 * hidden`` MLP width (not
    read from config.json), LayerNorm epsilon, no head dimension."""
    writer.add_context_length(2048)
    writer.add_tensor_data_layout("jploski")
    writer.add_embedding_length(hf["hidden_size"])
    writer.add_feed_forward_length(4 * hf["hidden_size"])
    writer.add_block_count(hf["num_hidden_layers"])
    writer.add_head_count(hf["num_attention_heads"])
    writer.add_head_count_kv(hf.get("num_kv_heads") or 1)
    writer.add_layer_norm_eps(hf["layer_norm_epsilon"])


def write_llama_like_header(writer, hf: dict, arch: str) -> None:
    """The converter's metadata for the Llama-like architectures (Qwen3, Gemma, Phi-3, MoE)."""
    import gguf

    layers = hf["num_hidden_layers"]
    writer.add_context_length(hf["max_position_embeddings"])
    writer.add_embedding_length(hf["hidden_size"])
    writer.add_block_count(layers)
    writer.add_feed_forward_length(hf["intermediate_size"])
    writer.add_head_count(hf["num_attention_heads"])
    writer.add_head_count_kv(hf["num_key_value_heads"])
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(hf["rms_norm_eps"])
    rope = hf.get("rope_parameters") or {}
    if arch == "gemma3":
        rope = rope["full_attention"]
        if rope.get("rope_type") == "linear":
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(rope["factor"])
        writer.add_sliding_window(hf["sliding_window"])
        writer.add_sliding_window_pattern([t == "sliding_attention" for t in hf["layer_types"]])
    writer.add_rope_freq_base(rope.get("rope_theta", 10000.0))
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(hf["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(hf["final_logit_softcapping"])
        writer.add_sliding_window(hf["sliding_window"])
    if arch == "phi3":
        writer.add_rope_dimension_count(head_dim)
        if rope.get("rope_type") == "longrope":
            original = rope["original_max_position_embeddings"]
            scale = hf["max_position_embeddings"] / original
            writer.add_rope_scaling_orig_ctx_len(original)
            writer.add_rope_scaling_attn_factors(
                1.0 if scale <= 1 else math.sqrt(1 + math.log(scale) / math.log(original))
            )
            for kind in ("long", "short"):
                factors = np.asarray(rope[f"{kind}_factor"], np.float32)
                writer.add_tensor(f"rope_factors_{kind}.weight", factors)
    if arch == "llama":  # Mixtral
        writer.add_rope_dimension_count(head_dim)
        writer.add_expert_count(hf["num_local_experts"])
        writer.add_expert_used_count(hf["num_experts_per_tok"])
    if arch == "qwen3moe":
        writer.add_expert_count(hf.get("num_experts") or hf["num_local_experts"])
        writer.add_expert_used_count(hf["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(hf["moe_intermediate_size"])


def write_gguf_like_llama_cpp(hf_dir: str, out: str, tokenizer_gguf: str) -> str:
    """What ``convert_hf_to_gguf.py`` writes for these architectures, in float32."""
    import gguf
    from safetensors.numpy import load_file

    with open(os.path.join(hf_dir, "config.json")) as f:
        hf = json.load(f)
    arch = GGUF_ARCH[hf["model_type"]]
    layers = hf["num_hidden_layers"]
    writer = gguf.GGUFWriter(out, arch)
    if arch == "falcon":
        write_falcon_header(writer, hf)
    else:
        write_llama_like_header(writer, hf, arch)
    copy_tokenizer(writer, tokenizer_gguf)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], layers)
    tensors = stack_experts(load_file(os.path.join(hf_dir, "model.safetensors")))
    for name, array in tensors.items():
        if name == "lm_head.weight" and hf.get("tie_word_embeddings"):
            continue
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, name
        data = array.astype(np.float32)
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = hf["num_attention_heads" if "q_proj" in name else "num_key_value_heads"]
            data = llama_cpp_permute(data, heads)
        if arch == "falcon" and "query_key_value" in name:
            data = llama_cpp_falcon_qkv(data, hf)
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            data = data + 1.0  # the converter's Gemma norm shift
        writer.add_tensor(gguf_name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


# Qwen3 checkpoints do not slide (llama.cpp's qwen3 has no window), so the plain variant.
@pytest.mark.parametrize(
    "variant",
    [
        "qwen3",
        pytest.param("gemma3", marks=pytest.mark.slow),
        pytest.param("gemma2", marks=pytest.mark.slow),
        pytest.param("phi3-longrope", marks=pytest.mark.slow),
        pytest.param("qwen3-moe", marks=pytest.mark.slow),
        pytest.param("mixtral-top2", marks=pytest.mark.slow),
        pytest.param("falcon-40b-grouped", marks=pytest.mark.slow),
        pytest.param("falcon-mqa", marks=pytest.mark.slow),
    ],
)
def test_gguf_matches_safetensors(variant, tmp_path, smollm2_tokenizer, smollm2_gguf):
    hf_dir = save_family_model(str(tmp_path / "hf"), smollm2_tokenizer, variant)
    path = write_gguf_like_llama_cpp(hf_dir, str(tmp_path / "model.gguf"), smollm2_gguf)
    from_gguf, from_safetensors = load_model(path), load_model(hf_dir)
    ours, theirs = from_gguf.config, from_safetensors.config
    for field in (
        "model_type",
        "num_layers",
        "intermediate_size",
        "num_kv_heads",
        "head_dim",
        "parallel_attention",
        "num_parallel_norms",
        "qk_norm",
        "attention_scale",
        "tie_word_embeddings",
        "sliding_window",
        "layer_types",
        "moe",
    ):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.rms_norm_eps == pytest.approx(theirs.rms_norm_eps)  # stored as float32
    assert ours.rope_scaling.rope_type == theirs.rope_scaling.rope_type
    assert ours.rope_scaling.attention_factor == pytest.approx(theirs.rope_scaling.attention_factor)
    if variant.startswith("gemma"):
        assert ours.attn_logit_softcap == theirs.attn_logit_softcap
        assert ours.final_logit_softcap == theirs.final_logit_softcap
        assert ours.local_rope_theta == theirs.local_rope_theta
    flat_gguf = dict(nnx.to_flat_state(from_gguf.params))
    flat_st = dict(nnx.to_flat_state(from_safetensors.params))
    assert flat_gguf.keys() == flat_st.keys()
    for key, var in flat_st.items():
        np.testing.assert_allclose(
            np.asarray(flat_gguf[key].get_value()), np.asarray(var.get_value()), atol=1e-6
        )
    ids = np.random.default_rng(0).integers(0, ours.vocab_size, 20).tolist()
    diff = np.abs(
        full_sequence_logits(from_gguf, ids) - full_sequence_logits(from_safetensors, ids)
    )
    assert diff.max() <= 1e-5
    assert from_gguf.tokenizer.encode("Hello there") == smollm2_tokenizer.encode("Hello there")
