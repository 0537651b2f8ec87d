"""Greedy output with speculation against without, token for token, on the default model: many
prompts decoding together through chunked prefill, preemption and the prefix cache.

    python benchmarks/speculative_identity.py [--prompts 64] [--tokens 128] [--backends cpu]
        [--methods ngram draft_model] [--draft-quantization int8] [--quantization none]

The target is the default checkpoint dequantised to float32 (``--quantization``: the target's
weights as loaded, e.g. w4a8: the GGUF's kept with int8 activations); "draft_model" drafts with the same
checkpoint quantised at load (``--draft-quantization``). Every prompt shares a system prompt
(prefix-cache hits), the token budget is small (prompts are prefilled in chunks) and the KV pool
holds fewer tokens than the running sequences need (preemptions). Prints, per backend and
method, the prompts whose tokens differ from the engine without speculation (0 expected), the
acceptance counters, and the preemptions and prefix-cache hits both engines had.
"""

from __future__ import annotations

import argparse
import time

SYSTEM = (
    "You are a careful assistant. When asked to edit or copy text, give the whole text back, "
    "changed only where asked."
)
CODE = """def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    return subtotal * (1 + tax_rate)
"""
TASKS = [
    "Copy this code exactly:\n\n{code}",
    "Rename `subtotal` to `net` in this code and give it back whole:\n\n{code}",
    "Add a docstring to this function and give it back whole:\n\n{code}",
    "Explain what this code does in two sentences:\n\n{code}",
    "Write a short poem about the number {n}.",
    "List {n} fruits, one per line.",
    "What is {n} times 7? Answer with a sentence.",
    "Repeat this sentence {n} times: The tide comes in and the tide goes out.",
]


def prompts(count: int) -> list[list[dict]]:
    """``count`` chat conversations: input-grounded edits and plain chat, varied by a number."""
    return [
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": TASKS[i % len(TASKS)].format(code=CODE, n=2 + i)},
        ]
        for i in range(count)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--backends", nargs="+", default=["cpu"])
    parser.add_argument("--methods", nargs="+", default=["ngram", "draft_model"])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--draft-quantization", default="int8")
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--kv-cache-mib", type=int, default=96)
    parser.add_argument("--quantization", default="none")
    args = parser.parse_args()

    from jaxgen import LLM, SamplingParams
    from jaxgen.loaders import load_model
    from jaxgen.loaders.default_model import default_model_path

    target = load_model(None, dtype="float32", quantization=args.quantization)
    conversations = prompts(args.prompts)
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens)
    knobs = dict(
        max_model_len=1024,
        max_rolling_batch_size=args.max_num_seqs,
        max_rolling_batch_prefill_tokens=64,
        kv_cache_memory=args.kv_cache_mib << 20,
    )
    configs = {
        "ngram": {
            "method": "ngram",
            "num_speculative_tokens": args.k,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 3,
        }
    }
    if "draft_model" in args.methods:
        draft = load_model(
            default_model_path(), dtype="float32", quantization=args.draft_quantization
        )
        configs["draft_model"] = {
            "method": "draft_model",
            "model": draft,
            "num_speculative_tokens": args.k,
        }
    print(
        f"{args.prompts} prompts x {args.tokens} greedy tokens, target float32 ({args.quantization}), "
        f"{args.max_num_seqs} sequences at once, 64-token budget, {args.kv_cache_mib} MiB pool",
        flush=True,
    )
    for backend in args.backends:
        plain = LLM(target, **knobs, attention_backend=backend)
        start = time.perf_counter()
        expected = plain.chat(conversations, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        base = plain.stats()
        tokens = sum(len(out.outputs[0].token_ids) for out in expected)
        print(
            f"{backend:9s} none         {tokens} tokens in {seconds:.0f} s  "
            f"preemptions {base['preemptions']}  prefix hits {base['prefix_cache_hit_pages']}",
            flush=True,
        )
        for method in args.methods:
            llm = LLM(
                target, **knobs, attention_backend=backend, speculative_config=configs[method]
            )
            start = time.perf_counter()
            got = llm.chat(conversations, params, use_tqdm=False)
            seconds = time.perf_counter() - start
            stats = llm.stats()
            differ = [
                i
                for i, (want, have) in enumerate(zip(expected, got, strict=True))
                if want.outputs[0].token_ids != have.outputs[0].token_ids
            ]
            print(
                f"{backend:9s} {method:12s} differing prompts {len(differ)} {differ[:8]}  "
                f"{seconds:.0f} s  acceptance {stats['spec_decode_acceptance_rate']:.2f}  "
                f"drafts {stats['spec_decode_num_drafts']}  preemptions {stats['preemptions']}  "
                f"prefix hits {stats['prefix_cache_hit_pages']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
