"""Multi-LoRA against transformers + peft per family (tiny random checkpoints, fp32): one mixed
batch of the base model and two adapters (rank 8; rank 4 rsLoRA; MoE families: attention only),
greedy tokens and the max |delta logprob| against PeftModel unmerged and merged. From the
repository root:

    PYTHONPATH=. python -m benchmarks.lora_peft_table llama qwen2 mistral qwen3 gemma2 gemma3
"""

from __future__ import annotations

import sys
import tempfile

import numpy as np

from jaxgen import LLM, SamplingParams
from jaxgen.loaders.default_model import default_model_path
from jaxgen.loaders.tokenizer import load_tokenizer
from jaxgen.lora import LoRARequest
from tests.family_models import save_family_model, save_tiny_model
from tests.lora.peft_adapters import ALL_MODULES, peft_greedy, save_adapter

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
ADAPTERS = [dict(r=8, alpha=16), dict(r=4, alpha=8, rslora=True)]
TOKENS = 6


def family_rows(family: str, tokenizer) -> list[str]:
    root = tempfile.mkdtemp()
    if family in ("llama", "qwen2", "mistral"):
        base = save_tiny_model(f"{root}/base", tokenizer, arch=family)
    else:
        base = save_family_model(f"{root}/base", tokenizer, family)
    targets = ATTENTION if "moe" in family or "mixtral" in family else ALL_MODULES
    paths = [
        save_adapter(base, f"{root}/a{i}", seed=i + 1, targets=targets, **spec)
        for i, spec in enumerate(ADAPTERS)
    ]
    requests = [None] + [LoRARequest(f"a{i}", i + 1, path) for i, path in enumerate(paths)]
    rng = np.random.default_rng(0)
    prompts = [rng.integers(5, 4000, 9 + 4 * i).tolist() for i in range(len(requests))]
    llm = LLM(base, enable_lora=True, max_loras=2, max_lora_rank=8)
    params = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True, logprobs=0)
    outs = llm.generate(prompts, params, lora_request=requests, use_tqdm=False)
    rows = []
    for merged in (False, True):
        worst, equal = 0.0, True
        for request, prompt, out in zip(requests, prompts, outs, strict=True):
            path = None if request is None else request.lora_path
            tokens, logprobs = peft_greedy(base, path, prompt, TOKENS, merged)
            ours = out.outputs[0]
            equal &= list(ours.token_ids) == tokens
            if list(ours.token_ids) == tokens:
                mine = [e[t] for e, t in zip(ours.logprobs, ours.token_ids, strict=True)]
                worst = max(worst, float(np.abs(np.array(mine) - logprobs).max()))
        rows.append(f"{family} merged={merged} tokens_equal={equal} max_dlogprob={worst:.2e}")
    return rows


def main() -> None:
    tokenizer = load_tokenizer(default_model_path())
    for family in sys.argv[1:] or ["llama"]:
        for row in family_rows(family, tokenizer):
            print(row, flush=True)


if __name__ == "__main__":
    main()
