"""Random PEFT LoRA adapters over the tiny checkpoints (``peft.get_peft_model`` with
``init_lora_weights=False``, so B is nonzero), and transformers + peft's greedy reference."""

from __future__ import annotations

ALL_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def save_adapter(
    base_path: str,
    out: str,
    *,
    seed: int,
    r: int = 8,
    alpha: float = 16,
    targets=ALL_MODULES,
    rslora: bool = False,
    **config,
) -> str:
    """Writes a random LoRA adapter of the checkpoint at ``base_path`` to ``out``."""
    import peft
    import torch
    import transformers

    base = transformers.AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    lora = peft.LoraConfig(
        r=r,
        lora_alpha=alpha,
        target_modules=list(targets),
        use_rslora=rslora,
        init_lora_weights=False,
        **config,
    )
    torch.manual_seed(seed)
    model = peft.get_peft_model(base, lora)
    with torch.no_grad():  # larger than the init's, so every adapter moves the tokens
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.15)
    model.save_pretrained(out)
    return out


def peft_greedy(base_path: str, adapter: str | None, prompt: list[int], max_tokens: int, merged):
    """transformers + peft greedy tokens and each token's logprob (fp32), the adapter merged
    into the weights or applied unmerged (``PeftModel``); ``adapter`` None: the base model."""
    import peft
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    if adapter is not None:
        model = peft.PeftModel.from_pretrained(model, adapter)
        if merged:
            model = model.merge_and_unload()
    model.eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
        )
    tokens = out.sequences[0, len(prompt) :].tolist()
    logprobs = [
        float(torch.log_softmax(score[0].float(), -1)[token])
        for score, token in zip(out.scores, tokens, strict=True)
    ]
    return tokens, logprobs
