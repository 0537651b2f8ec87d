"""The transformers side of the device check's greedy parity (a process of its own: torch and
jax stay out of each other's way on the GPU). Writes tiny random checkpoints (the test suite's
``save_tiny_model``, with a word tokenizer made here), then ``ready.json`` with the prompts, so
jaxgen can load them while this process computes transformers' float32 greedy tokens, one
prompt at a time, into ``hf_tokens.json``.

    python benchmarks/gpu/hf_parity_models.py --dir /tmp/parity --models llama,qwen3,gemma3
        [--prompt-lens 5,17,16,33] [--max-tokens 16] [--device cuda]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from benchmarks.gpu.word_tokenizer import random_prompts, word_tokenizer  # noqa: E402

VOCAB_SIZE = 256


def family_models():
    """tests/family_models.py, loaded from its file (a ``tests`` package installed elsewhere
    must not shadow it)."""
    path = os.path.join(REPO, "tests", "family_models.py")
    spec = importlib.util.spec_from_file_location("device_check_family_models", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def save_models(directory: str, names: list[str]) -> dict[str, str]:
    """Writes each named model (``llama``: the suite's default tiny Llama; ``qwen3``,
    ``gemma3``: its VARIANTS of those names) under ``directory``; returns their paths."""
    families = family_models()
    variants = {"llama": ("llama", {}), **families.VARIANTS}
    tokenizer = word_tokenizer(VOCAB_SIZE)
    paths = {}
    for name in names:
        family, overrides = variants[name]
        path = os.path.join(directory, name)
        families.save_tiny_model(path, tokenizer, arch=family, **overrides)
        paths[name] = path
    return paths


def greedy_tokens(path: str, prompts, max_tokens: int, device: str) -> list[list[int]]:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model = model.to(device).eval()
    out = []
    for prompt in prompts:
        with torch.no_grad():
            tokens = model.generate(
                torch.tensor([prompt], device=device),
                attention_mask=torch.ones((1, len(prompt)), dtype=torch.long, device=device),
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        out.append(tokens[0, len(prompt) :].tolist())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--models", default="llama,qwen3,gemma3")
    parser.add_argument("--prompt-lens", default="5,17,16,33")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()

    import numpy as np
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 here
    torch.set_float32_matmul_precision("highest")
    start = time.perf_counter()
    os.makedirs(args.dir, exist_ok=True)
    names = args.models.split(",")
    paths = save_models(args.dir, names)
    rng = np.random.default_rng(args.seed)
    lengths = [int(n) for n in args.prompt_lens.split(",")]
    prompts = random_prompts(rng, len(lengths), lengths, VOCAB_SIZE)
    ready = {"paths": paths, "prompts": prompts, "max_tokens": args.max_tokens}
    with open(os.path.join(args.dir, "ready.json.tmp"), "w") as f:
        json.dump(ready, f)
    os.replace(os.path.join(args.dir, "ready.json.tmp"), os.path.join(args.dir, "ready.json"))
    print(f"[hf parity] checkpoints written in {time.perf_counter() - start:.1f} s", flush=True)
    tokens = {
        name: greedy_tokens(paths[name], prompts, args.max_tokens, args.device) for name in names
    }
    result = {"tokens": tokens, "device": args.device, "torch": torch.__version__}
    with open(os.path.join(args.dir, "hf_tokens.json.tmp"), "w") as f:
        json.dump(result, f)
    os.replace(
        os.path.join(args.dir, "hf_tokens.json.tmp"), os.path.join(args.dir, "hf_tokens.json")
    )
    print(f"[hf parity] greedy tokens in {time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
