"""Mixture-of-experts decode cost: a Mixtral-shaped model with 8 experts, top-2 routing, against
the same model with a dense MLP as wide as two experts (what each token computes), one request at
a time, both warm, in one run. The step's cost should follow the active experts (ratio near 1),
not the total (ratio near 4).

    python benchmarks/moe_decode.py [--hidden 768] [--expert-width 2048] [--layers 4]
        [--tokens 64] [--backend auto]

The checkpoints are random (built with transformers, saved to a temporary directory) and use
the default model's tokenizer; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import tempfile
import time


def save_checkpoint(path: str, *, moe: bool, args, tokenizer) -> str:
    import torch
    import transformers

    torch.manual_seed(0)
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=args.hidden // 128,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    if moe:
        config = transformers.MixtralConfig(
            intermediate_size=args.expert_width,
            num_local_experts=8,
            num_experts_per_tok=2,
            **common,
        )
        model = transformers.MixtralForCausalLM(config)
    else:
        config = transformers.MistralConfig(intermediate_size=2 * args.expert_width, **common)
        model = transformers.MistralForCausalLM(config)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def decode_ms_per_step(path: str, args) -> float:
    from jaxgen import LLM, SamplingParams

    llm = LLM(path, batching="none", max_model_len=256, attention_backend=args.backend)
    prompt = list(range(1000, 1016))
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    llm.generate([prompt], params, use_tqdm=False)  # warm-up: compiles every shape used below
    steps0, start = llm.stats()["steps"], time.perf_counter()
    llm.generate([prompt], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    steps = llm.stats()["steps"] - steps0
    return elapsed / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--expert-width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args()

    import jax

    from jaxgen.loaders.default_model import default_model_path
    from jaxgen.loaders.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(default_model_path())
    with tempfile.TemporaryDirectory() as tmp:
        dense = save_checkpoint(f"{tmp}/dense", moe=False, args=args, tokenizer=tokenizer)
        moe = save_checkpoint(f"{tmp}/moe", moe=True, args=args, tokenizer=tokenizer)
        dense_ms = decode_ms_per_step(dense, args)
        moe_ms = decode_ms_per_step(moe, args)
    print(f"device: {jax.devices()[0].device_kind}  backend: {args.backend}")
    print(
        f"hidden {args.hidden}, {args.layers} layers, expert width {args.expert_width}; "
        f"{args.tokens} tokens, batch 1"
    )
    print(f"dense (MLP width {2 * args.expert_width})      {dense_ms:.2f} ms/step")
    print(f"MoE (8 experts, top-2)        {moe_ms:.2f} ms/step")
    print(f"ratio MoE / dense             {moe_ms / dense_ms:.2f}x")


if __name__ == "__main__":
    main()
