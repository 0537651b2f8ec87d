"""Multi-LoRA against transformers + peft (fp32) on tiny random checkpoints: one mixed batch of
the base model and several adapters (ranks, target sets, rsLoRA; more adapters than device
slots), greedy tokens equal and logprobs close to ``PeftModel``'s, merged and unmerged; no
compile when adapters load, switch or mix."""

from __future__ import annotations

import numpy as np
import pytest

from jaxgen import LLM, SamplingParams
from jaxgen.lora import LoRARequest
from tests.family_models import save_family_model, save_tiny_model
from tests.lora.peft_adapters import peft_greedy, save_adapter

MAX_TOKENS = 6
# name -> adapter options: ranks below the slots', a subset of modules, rsLoRA.
ADAPTERS = {
    "all-r8": dict(r=8, alpha=16),
    "attn-r4-rslora": dict(r=4, alpha=8, targets=("q_proj", "v_proj", "o_proj"), rslora=True),
    "mlp-r2": dict(r=2, alpha=4, targets=("gate_proj", "up_proj", "down_proj")),
}
LOGPROB_TOLERANCE = 2e-4


@pytest.fixture(scope="module")
def family_adapters(tmp_path_factory, smollm2_tokenizer):
    """family -> (checkpoint, {name: adapter dir}), built once per module on first use."""
    cache = {}

    def get(family: str):
        if family not in cache:
            root = tmp_path_factory.mktemp(f"lora-{family}")
            if family == "llama":
                base = save_tiny_model(str(root / "base"), smollm2_tokenizer)
            else:
                base = save_family_model(str(root / "base"), smollm2_tokenizer, family)
            adapters = {
                name: save_adapter(base, str(root / name), seed=seed, **options)
                for seed, (name, options) in enumerate(ADAPTERS.items(), 1)
            }
            cache[family] = (base, adapters)
        return cache[family]

    return get


def _mixed_batch(base, adapters, **knobs):
    """Each adapter on two prompts, the base model on one, all in one ``generate``."""
    rng = np.random.default_rng(0)
    requests = [None] + [
        LoRARequest(name, i, path) for i, (name, path) in enumerate(adapters.items(), 1)
    ]
    jobs = [
        (lora, rng.integers(5, 4000, 7 + 3 * k).tolist()) for k in range(2) for lora in requests
    ]
    jobs = jobs[1:]  # the base model once
    llm = LLM(base, enable_lora=True, max_lora_rank=8, **knobs)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    outs = llm.generate(
        [prompt for _, prompt in jobs], params, lora_request=[lora for lora, _ in jobs]
    )
    return llm, jobs, outs


@pytest.mark.parametrize(
    "family",
    ["llama", *(pytest.param(f, marks=pytest.mark.slow) for f in ("qwen3", "gemma2"))],
)
def test_mixed_batch_matches_peft(family, family_adapters):
    base, adapters = family_adapters(family)
    _, jobs, outs = _mixed_batch(base, adapters, max_loras=3)
    for (lora, prompt), out in zip(jobs, outs, strict=True):
        path = None if lora is None else lora.lora_path
        tokens, logprobs = peft_greedy(base, path, prompt, MAX_TOKENS, merged=False)
        ours = out.outputs[0]
        name = None if lora is None else lora.lora_name
        assert list(ours.token_ids) == tokens, (family, name)
        mine = [entry[t] for entry, t in zip(ours.logprobs, ours.token_ids, strict=True)]
        assert np.abs(np.array(mine) - logprobs).max() < LOGPROB_TOLERANCE, (family, name)


def test_more_adapters_than_slots_matches_merged_peft(family_adapters):
    """Three adapters over two device slots (the scheduler waits for a slot, LRU eviction),
    against peft's merged weights."""
    base, adapters = family_adapters("llama")
    llm, jobs, outs = _mixed_batch(base, adapters, max_loras=2, max_cpu_loras=1)
    for (lora, prompt), out in zip(jobs, outs, strict=True):
        path = None if lora is None else lora.lora_path
        tokens, _ = peft_greedy(base, path, prompt, MAX_TOKENS, merged=True)
        assert list(out.outputs[0].token_ids) == tokens
    assert llm.engine.lora.slot_loads >= 3


def test_qwen2_adapter_matches_peft(tmp_path, smollm2_tokenizer):
    """A second Llama-block family with biases on q/k/v."""
    base = save_tiny_model(str(tmp_path / "base"), smollm2_tokenizer, arch="qwen2")
    adapter = save_adapter(base, str(tmp_path / "a"), seed=7, r=4, alpha=32, rslora=True)
    llm = LLM(base, enable_lora=True, max_lora_rank=4)
    prompt = list(range(30, 45))
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    (out,) = llm.generate([prompt], params, lora_request=LoRARequest("a", 1, adapter))
    assert (
        list(out.outputs[0].token_ids) == peft_greedy(base, adapter, prompt, MAX_TOKENS, False)[0]
    )


def test_adapters_load_switch_and_mix_without_compiling(family_adapters):
    base, adapters = family_adapters("llama")
    llm = LLM(base, enable_lora=True, max_loras=2, max_lora_rank=8, precompile=True)
    requests = [LoRARequest(name, i, path) for i, (name, path) in enumerate(adapters.items(), 1)]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    prompts = [list(range(10, 10 + n)) for n in (5, 9, 40)]
    llm.generate(prompts, params, lora_request=requests[0])  # the first adapter
    compiles = llm.stats()["compiles"]
    llm.generate(prompts, params, lora_request=requests[1])  # a second one
    llm.generate(prompts, params, lora_request=[requests[2], None, requests[0]])  # evicts, mixes
    llm.generate(prompts, params)  # none
    assert llm.stats()["compiles"] == compiles
    assert llm.engine.lora.slot_loads >= 3
