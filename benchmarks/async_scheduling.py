"""Asynchronous scheduling against one step at a time, default model, in one run: single-stream
decode (batch 1, 128 new tokens) and batched chat (64 prompts x 64 tokens), for each weight
variant asked, with the two engines' runs interleaved (best of ``--repeats``, all warm).

    python benchmarks/async_scheduling.py [--variants float32,int4-gguf] [--repeats 3]

On this CPU the "device" is the same two cores as the host, so the host's work overlaps the
step's only where the step leaves a core idle; on an accelerator the whole host time hides.
"""

from __future__ import annotations

import argparse
import platform

from quantized_weights import VARIANTS, batched, single_stream


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variants", default="float32,int4-gguf", help=", ".join(VARIANTS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--batch-prompts", type=int, default=64)
    parser.add_argument("--batch-tokens", type=int, default=64)
    parser.add_argument("--skip-batched", action="store_true")
    args = parser.parse_args()

    from jaxgen import LLM
    from jaxgen.loaders import load_model

    engines = {}
    for variant in args.variants.split(","):
        loaded = load_model(None, quantization=VARIANTS[variant])
        for ahead in (False, True):
            llm = LLM(
                loaded,
                max_model_len=512,
                kv_cache_memory=512 << 20,
                precompile=not args.skip_batched,
                async_scheduling=ahead,
            )
            single_stream(llm, 8)  # warm
            if not args.skip_batched:
                batched(llm, args.batch_prompts, 4)
            engines[variant, ahead] = llm
    best = {key: [0.0, 0.0] for key in engines}
    for _ in range(args.repeats):  # interleaved: drift and other load hit both engines alike
        for key, llm in engines.items():
            best[key][0] = max(best[key][0], single_stream(llm, args.tokens))
            if not args.skip_batched:
                speed = batched(llm, args.batch_prompts, args.batch_tokens)
                best[key][1] = max(best[key][1], speed)
    print(f"{platform.processor() or platform.machine()}, best of {args.repeats}")
    print("| weights | single sync | single async | x | batched sync | batched async | x |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for variant in args.variants.split(","):
        (s1, b1), (s2, b2) = best[variant, False], best[variant, True]
        batched_cells = "- | - | -" if args.skip_batched else f"{b1:.1f} | {b2:.1f} | {b2 / b1:.3f}"
        print(f"| {variant} | {s1:.1f} | {s2:.1f} | {s2 / s1:.3f} | {batched_cells} |")
    for key, llm in engines.items():
        if key[1]:
            print(f"{key[0]}: {llm.stats()['async_steps']} of {llm.stats()['steps']} steps ahead")


if __name__ == "__main__":
    main()
