"""GGUF tensor names -> Hugging Face names, per architecture.

llama.cpp's converter renames tensors per architecture (``blk.N.ffn_norm`` is Llama's
post-attention norm but Gemma's pre-feedforward norm), stacks a layer's experts in one tensor,
and names Falcon's tensors after Llama's; these tables and functions undo that.
"""

from __future__ import annotations

# GGUF general.architecture -> HF model_type
SUPPORTED_GGUF_ARCHITECTURES = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
    "phi3": "phi3",
    "qwen3moe": "qwen3_moe",
    "falcon": "falcon",
}
# Stacked expert tensors [E, out, in] -> the per-expert HF projection each slice is (Qwen3-MoE's
# name, Mixtral's name: Mixtral is llama.cpp's "llama" architecture with experts).
EXPERT_TENSORS = {
    "ffn_gate_exps": ("gate_proj", "w1"),
    "ffn_up_exps": ("up_proj", "w3"),
    "ffn_down_exps": ("down_proj", "w2"),
}
# Phi-3's fused tensors keep their HF names (split at load like the safetensors ones).
PHI3_LAYER_NAMES = {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
GEMMA_ARCHITECTURES = ("gemma2", "gemma3")
# Gemma-specific block names (they replace the Llama meaning of ffn_norm).
GEMMA_LAYER_NAMES = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# Falcon's tensors under its HF names (``transformer.h.N...``). Falcon-40B's two LayerNorms are
# ``attn_norm`` (its ``ln_mlp``) and ``attn_norm_2`` (its ``ln_attn``); 7B's one is ``attn_norm``.
FALCON_LAYER_NAMES = {
    "attn_qkv": "self_attention.query_key_value",
    "attn_output": "self_attention.dense",
    "ffn_up": "mlp.dense_h_to_4h",
    "ffn_down": "mlp.dense_4h_to_h",
    "attn_norm_2": "ln_attn",
}
FALCON_NAMES = {
    "token_embd.weight": "transformer.word_embeddings.weight",
    "output_norm.weight": "transformer.ln_f.weight",
    "output_norm.bias": "transformer.ln_f.bias",
    "output.weight": "lm_head.weight",
}

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


def expert_tensor_names(name: str, architecture: str, num_experts: int) -> list[str] | None:
    """The HF names of the experts a stacked expert tensor ``[E, out, in]`` holds, in order
    (Mixtral is llama.cpp's "llama" architecture with experts); None for any other tensor."""
    parts = name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or parts[2] not in EXPERT_TENSORS:
        return None
    mixtral = architecture == "llama"
    proj = EXPERT_TENSORS[parts[2]][int(mixtral)]
    block = "block_sparse_moe" if mixtral else "mlp"
    return [
        f"model.layers.{parts[1]}.{block}.experts.{expert}.{proj}.weight"
        for expert in range(num_experts)
    ]


def hf_tensor_name(name: str, architecture: str, gguf_names: set[str]) -> str:
    """The HF name of GGUF tensor ``name`` (not a stacked expert tensor). ``gguf_names``: every
    tensor name in the file (Falcon's ``attn_norm`` is the MLP's norm when ``attn_norm_2``
    exists)."""
    if architecture == "llama" and name.endswith("ffn_gate_inp.weight"):
        return f"model.layers.{name.split('.')[1]}.block_sparse_moe.gate.weight"
    if architecture == "falcon":
        return _falcon_tensor_name(name, gguf_names)
    return _llama_style_tensor_name(name, architecture)


def _falcon_tensor_name(name: str, gguf_names: set[str]) -> str:
    if name in FALCON_NAMES:
        return FALCON_NAMES[name]
    _, layer, kind, leaf = name.split(".", 3)
    if kind == "attn_norm":  # the MLP's norm when the layer has a second (attention) norm
        two_norms = f"blk.{layer}.attn_norm_2.weight" in gguf_names
        kind_name = "ln_mlp" if two_norms else "input_layernorm"
    else:
        kind_name = FALCON_LAYER_NAMES.get(kind, kind)
    return f"transformer.h.{layer}.{kind_name}.{leaf}"


def _llama_style_tensor_name(name: str, architecture: str) -> str:
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    if name.startswith("blk."):
        _, layer, kind, leaf = name.split(".", 3)
        if architecture in GEMMA_ARCHITECTURES and kind in GEMMA_LAYER_NAMES:
            return f"model.layers.{layer}.{GEMMA_LAYER_NAMES[kind]}.{leaf}"
        if architecture == "phi3" and kind in PHI3_LAYER_NAMES:
            return f"model.layers.{layer}.{PHI3_LAYER_NAMES[kind]}.{leaf}"
        if kind in LAYER_NAMES:
            return f"model.layers.{layer}.{LAYER_NAMES[kind]}.{leaf}"
    return name
