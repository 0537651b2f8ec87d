"""What llama.cpp's converter does to every Llama-shaped family's GGUF, undone: its tensor names
(``blk.N.attn_q`` for ``model.layers.N.self_attn.q_proj``), its config keys
(``{architecture}.attention.head_count``), and for the ``llama`` architecture its rotary
permutation of the Q and K rows. A family's module adds what its converter changes."""

from __future__ import annotations

import numpy as np

LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def gguf_tensor_name(name: str, gguf_names: set[str], layer_names=None) -> str:
    """The HF name of GGUF tensor ``name``; ``layer_names``: the family's own block names,
    looked up before the Llama ones."""
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    if name.startswith("blk."):
        _, layer, kind, leaf = name.split(".", 3)
        for table in (layer_names or {}, LAYER_NAMES):
            if kind in table:
                return f"model.layers.{layer}.{table[kind]}.{leaf}"
    return name


def gguf_config(gguf, model_type: str) -> dict:
    """A HF ``config.json``-style dictionary from a Llama-shaped file's metadata (``gguf``: a
    ``jaxgen.loaders.gguf_loader.GGUFFile``)."""
    get = gguf.arch_field
    num_heads = get("attention.head_count")
    hidden = get("embedding_length")
    config = {
        "model_type": model_type,
        "vocab_size": gguf.vocab_size(),
        "hidden_size": hidden,
        "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": get("attention.head_count_kv", num_heads),
        "head_dim": get("attention.key_length")
        or get("rope.dimension_count")
        or hidden // num_heads,
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": get("rope.freq_base", 10000.0),
        "max_position_embeddings": get("context_length", 4096),
        "tie_word_embeddings": "output.weight" not in gguf.gguf_names,
        "bos_token_id": gguf.field("tokenizer.ggml.bos_token_id"),
        "eos_token_id": gguf.field("tokenizer.ggml.eos_token_id"),
    }
    if get("rope.scaling.type") == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": get("rope.scaling.factor", 1.0)}
    sliding = get("attention.sliding_window")
    if sliding:
        config["sliding_window"] = sliding
    return config


def unpermute_rotary(gguf, name: str, rows: np.ndarray) -> np.ndarray:
    """Q/K projection rows (first axis) of a ``llama``-architecture GGUF back in HF's
    rotate-half layout: the inverse of llama.cpp's ``permute`` (interleaved rotary pairs)."""
    if not (name.endswith("q_proj.weight") or name.endswith("k_proj.weight")):
        return rows
    kv = name.endswith("k_proj.weight")
    heads = gguf.arch_field("attention.head_count" + ("_kv" if kv else ""))
    count = rows.shape[0]
    return (
        rows.reshape(heads, count // heads // 2, 2, *rows.shape[1:])
        .swapaxes(1, 2)
        .reshape(rows.shape)
    )
