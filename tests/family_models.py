"""Tiny random checkpoints of every supported family, built with transformers and saved with
``save_pretrained`` (safetensors) next to the SmolLM2 tokenizer; nothing is downloaded."""

from __future__ import annotations

LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 1.7, 2.0],
    "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0],
}

# name -> (transformers family, config overrides). Windows of 8 are shorter than the prompts.
VARIANTS = {
    "qwen3": ("qwen3", dict(head_dim=16)),
    "qwen3-sliding": (
        "qwen3",
        dict(use_sliding_window=True, sliding_window=8, max_window_layers=1, num_hidden_layers=3),
    ),
    "gemma2": ("gemma2", dict(sliding_window=8, num_hidden_layers=3)),
    "gemma2-untied-mqa": (
        "gemma2",
        dict(sliding_window=8, tie_word_embeddings=False, num_key_value_heads=1),
    ),
    "gemma3": (
        "gemma3_text",
        dict(
            sliding_window=8,
            num_hidden_layers=3,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            rope_scaling={"rope_type": "linear", "factor": 8.0},
        ),
    ),
    "phi3": ("phi3", dict()),
    "phi3-longrope": (
        "phi3",
        dict(
            original_max_position_embeddings=32, max_position_embeddings=512, rope_scaling=LONGROPE
        ),
    ),
    "mixtral-top2": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2)),
    "mixtral-top1": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=1)),
    "qwen3-moe": (
        "qwen3_moe",
        dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True),
    ),
    "qwen3-moe-unnormalized-dense-layer": (
        "qwen3_moe",
        dict(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=False,
            mlp_only_layers=[0],
        ),
    ),
    "qwen2-moe-shared-expert": (
        "qwen2_moe",
        dict(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
        ),
    ),
    "falcon-mqa": ("falcon", dict(multi_query=True, num_kv_heads=1)),
    "falcon-40b-grouped": (
        "falcon",
        dict(new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=2, bias=False),
    ),
    "falcon-grouped-one-norm": (
        "falcon",
        dict(new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1),
    ),
    "falcon-mha-sequential-bias": (
        "falcon",
        dict(multi_query=False, parallel_attn=False, bias=True),
    ),
}


def _classes(family: str):
    import transformers

    return {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM),
        "gemma3_text": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM),
        "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM),
        "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM),
        "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM),
        "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM),
        "falcon": (transformers.FalconConfig, transformers.FalconForCausalLM),
    }[family]


def save_tiny_model(
    path: str, tokenizer, *, arch: str = "llama", seed: int = 0, **overrides
) -> str:
    """Writes a small random HF checkpoint of family ``arch`` (a transformers ``model_type``;
    2 layers, hidden 64, GQA 4/2, untied) plus the SmolLM2 tokenizer to ``path``; ``overrides``
    are config fields."""
    import torch

    config_cls, model_cls = _classes(arch)
    torch.manual_seed(seed)
    base = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
    )
    gemma = arch.startswith("gemma")
    if gemma:
        base.update(head_dim=16, query_pre_attn_scalar=16, tie_word_embeddings=True)
    if arch == "falcon":
        base.pop("num_key_value_heads")
        base.pop("intermediate_size")
        base.update(ffn_hidden_size=128, alibi=False, layer_norm_epsilon=1e-5)
    else:
        base["rms_norm_eps"] = 1e-6 if gemma else 1e-5
    base.update(overrides)
    model = model_cls(config_cls(**base)).eval()
    with torch.no_grad():  # larger weights than the init's 0.02 std make logits informative
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
            elif "norm" in name or "ln" in name:  # Gemma's norms scale by (1 + weight)
                p.normal_(0.0 if gemma else 1.0, 0.1)
            else:
                p.normal_(0.0, 0.05)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def save_family_model(path: str, tokenizer, variant: str, *, seed: int = 0) -> str:
    """Writes the tiny random checkpoint ``variant`` of :data:`VARIANTS` to ``path``."""
    family, overrides = VARIANTS[variant]
    return save_tiny_model(path, tokenizer, arch=family, seed=seed, **overrides)


def hf_greedy_tokens(path: str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """transformers' (fp32) greedy ``generate`` of exactly ``max_tokens`` new tokens per prompt,
    one prompt at a time."""
    import torch
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = []
    for prompt in prompts:
        with torch.no_grad():
            tokens = hf.generate(
                torch.tensor([prompt]),
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        out.append(tokens[0, len(prompt) :].tolist())
    return out
