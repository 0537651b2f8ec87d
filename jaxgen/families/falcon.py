"""Falcon: fused QKV (multi-head, multi-query, or the grouped "new decoder architecture"),
LayerNorms with bias (one or two per block), a GELU MLP without a gate, attention and MLP in
parallel; its own tensor names (``transformer.h.N``) and config keys. llama.cpp writes the
fused QKV rows as all queries, all keys, all values."""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxgen.families.checkpoint_names import LEAF, torch_layout
from jaxgen.families.family import ModelFamily
from jaxgen.families.hf_fields import eos_ids, rope_parameters, rope_scaling

MLP_NORM_AXES = ((r"layers\.\d+\.mlp_layernorm\.(weight|bias)", ("embed",)),)
# Our module path -> its tensor's module path, within a layer.
LAYER_NAMES = {
    "self_attn.o_proj": "self_attention.dense",
    "mlp.up_proj": "mlp.dense_h_to_4h",
    "mlp.down_proj": "mlp.dense_4h_to_h",
}
# GGUF block names -> HF. Falcon-40B's two LayerNorms are ``attn_norm`` (its ``ln_mlp``) and
# ``attn_norm_2`` (its ``ln_attn``); 7B's one is ``attn_norm``.
GGUF_LAYER_NAMES = {
    "attn_qkv": "self_attention.query_key_value",
    "attn_output": "self_attention.dense",
    "ffn_up": "mlp.dense_h_to_4h",
    "ffn_down": "mlp.dense_4h_to_h",
    "attn_norm_2": "ln_attn",
}
GGUF_NAMES = {
    "token_embd.weight": "transformer.word_embeddings.weight",
    "output_norm.weight": "transformer.ln_f.weight",
    "output_norm.bias": "transformer.ln_f.bias",
    "output.weight": "lm_head.weight",
}


def config_fields(hf: dict) -> dict[str, Any]:
    if hf.get("alibi"):
        raise ValueError(
            "Falcon with alibi=True is not supported (ALiBi position biases); only RoPE Falcon "
            "checkpoints (alibi=false) load"
        )
    new_arch = bool(hf.get("new_decoder_architecture", False))
    parallel = bool(hf.get("parallel_attn", True))
    if new_arch and not parallel:
        raise ValueError(
            "Falcon new_decoder_architecture with parallel_attn=False is not supported"
        )
    num_heads = hf.get("num_attention_heads") or hf.get("n_head")
    hidden = hf["hidden_size"]
    if new_arch:
        num_kv_heads = hf.get("num_kv_heads") or num_heads
    elif hf.get("multi_query", True):
        num_kv_heads = 1
    else:
        num_kv_heads = num_heads
    rope = rope_parameters(hf)
    norms = hf.get("num_ln_in_parallel_attn")
    if norms is None:
        norms = 2 if new_arch else 1
    act = hf.get("activation", "gelu")
    if act != "gelu":
        raise ValueError(f"Falcon activation {act!r} is not supported; supported: gelu")
    bias = bool(hf.get("bias", False))
    return dict(
        model_type="falcon",
        vocab_size=hf["vocab_size"],
        hidden_size=hidden,
        intermediate_size=hf.get("ffn_hidden_size") or 4 * hidden,
        num_layers=hf.get("num_hidden_layers") or hf.get("n_layer"),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=hidden // num_heads,
        rms_norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        rope_scaling=rope_scaling(rope, hf, hidden // num_heads),
        max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=bias,
        hidden_act="gelu",
        parallel_attention=parallel,
        num_parallel_norms=int(norms) if (parallel and new_arch) else 1,
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=eos_ids(hf),
    )


def read_parameter(config, path: tuple, get) -> np.ndarray:
    leaf = LEAF[path[-1]]
    if path[0] == "embed_tokens":
        return np.asarray(get("transformer.word_embeddings.weight"))
    if path[0] == "norm":
        return np.asarray(get(f"transformer.ln_f.{leaf}"))
    if path[0] == "lm_head":
        return np.asarray(get("lm_head.weight")).T
    layer, module = path[1], ".".join(str(p) for p in path[2:-1])
    prefix = f"transformer.h.{layer}"
    if module in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
        fused = np.asarray(get(f"{prefix}.self_attention.query_key_value.{leaf}"))
        return torch_layout(path, split_qkv(config, fused, module[-6]))
    if module == "input_layernorm":
        name = "ln_attn" if config.num_parallel_norms == 2 else "input_layernorm"
    elif module == "mlp_layernorm":
        name = "ln_mlp" if config.parallel_attention else "post_attention_layernorm"
    else:
        name = LAYER_NAMES[module]
    return torch_layout(path, np.asarray(get(f"{prefix}.{name}.{leaf}")))


def split_qkv(config, fused: np.ndarray, which: str) -> np.ndarray:
    """Rows of ``q``, ``k`` or ``v`` from the fused QKV: per KV head, its group of query
    heads, then one key head, then one value head (this covers multi-query, whose single group
    is every query head, and the old per-head q/k/v interleave, whose groups are one head)."""
    kv, hd = config.num_kv_heads, config.head_dim
    group = config.num_heads // kv
    grouped = fused.reshape(kv, group + 2, hd, *fused.shape[1:])
    part = {"q": grouped[:, :group], "k": grouped[:, group : group + 1], "v": grouped[:, -1:]}
    return part[which].reshape(-1, *fused.shape[1:])


def no_direct_name(config, path: tuple) -> None:
    return None  # every tensor is renamed, split or stacked


def gguf_config(gguf) -> dict:
    """llama.cpp runs every Falcon as parallel attention and MLP without linear biases: 7B's
    multi-query layout, or 40B's grouped KV heads (``new_decoder_architecture``) with a second
    LayerNorm when ``attn_norm_2`` exists. The converter writes ``4 * hidden`` as the MLP width
    whatever the checkpoint's, so the width is read from ``ffn_up``'s shape."""
    get = gguf.arch_field
    num_kv_heads = get("attention.head_count_kv", 1)
    two_norms = "transformer.h.0.ln_attn.weight" in gguf.tensors
    up = gguf.tensors["transformer.h.0.mlp.dense_h_to_4h.weight"][0]
    return {
        "model_type": "falcon",
        "vocab_size": gguf.vocab_size(),
        "hidden_size": get("embedding_length"),
        "ffn_hidden_size": int(up.shape[-1]),  # ggml order: [in, out]
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": get("attention.head_count"),
        "num_kv_heads": num_kv_heads,
        "multi_query": num_kv_heads == 1,
        "new_decoder_architecture": num_kv_heads > 1 or two_norms,
        "num_ln_in_parallel_attn": 2 if two_norms else 1,
        "parallel_attn": True,
        "alibi": False,
        "bias": "transformer.h.0.self_attention.query_key_value.bias" in gguf.tensors,
        "layer_norm_epsilon": get("attention.layer_norm_epsilon", 1e-5),
        "rope_theta": get("rope.freq_base", 10000.0),
        "max_position_embeddings": get("context_length", 2048),
        "tie_word_embeddings": "lm_head.weight" not in gguf.tensors,
        "bos_token_id": gguf.field("tokenizer.ggml.bos_token_id"),
        "eos_token_id": gguf.field("tokenizer.ggml.eos_token_id"),
    }


def gguf_tensor_name(name: str, gguf_names: set[str]) -> str:
    """``gguf_names``: every tensor name in the file (``attn_norm`` is the MLP's norm when the
    layer has a second, attention, norm ``attn_norm_2``)."""
    if name in GGUF_NAMES:
        return GGUF_NAMES[name]
    _, layer, kind, leaf = name.split(".", 3)
    if kind == "attn_norm":
        two_norms = f"blk.{layer}.attn_norm_2.weight" in gguf_names
        kind_name = "ln_mlp" if two_norms else "input_layernorm"
    else:
        kind_name = GGUF_LAYER_NAMES.get(kind, kind)
    return f"transformer.h.{layer}.{kind_name}.{leaf}"


def grouped_qkv(gguf, name: str, rows: np.ndarray) -> np.ndarray:
    """Inverse of llama.cpp's QKV reorder: all query heads, all key heads, all value heads back
    to per KV head its group of query heads, one key head, one value head."""
    if "query_key_value" not in name:
        return rows
    num_heads = gguf.arch_field("attention.head_count")
    num_kv_heads = gguf.arch_field("attention.head_count_kv", 1)
    head_dim = rows.shape[0] // (num_heads + 2 * num_kv_heads)
    rest = rows.shape[1:]
    q_rows, k_rows = num_heads * head_dim, num_kv_heads * head_dim
    q = rows[:q_rows].reshape(num_kv_heads, num_heads // num_kv_heads, head_dim, *rest)
    k = rows[q_rows : q_rows + k_rows].reshape(num_kv_heads, 1, head_dim, *rest)
    v = rows[q_rows + k_rows :].reshape(num_kv_heads, 1, head_dim, *rest)
    return np.concatenate([q, k, v], axis=1).reshape(rows.shape)


FAMILY = ModelFamily(
    model_type="falcon",
    architectures=("FalconForCausalLM",),
    config_fields=config_fields,
    blocks="falcon",
    read_parameter=read_parameter,
    direct_name=no_direct_name,
    logical_axes=MLP_NORM_AXES,
    mlp_projections=2,
    gguf_architecture="falcon",
    gguf_config=gguf_config,
    gguf_tensor_name=gguf_tensor_name,
    gguf_rows=grouped_qkv,
)
