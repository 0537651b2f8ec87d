"""How the engine hides its host work, against one step at a time, default model, in one run:
single-stream decode (batch 1, 128 new tokens) and batched chat (64 prompts x 64 tokens), for
each weight variant and mode asked, the engines' runs interleaved (best of ``--repeats``, warm).

    python benchmarks/scheduling_modes.py [--variants float32,int4-gguf]
        [--modes sync,async,steps8] [--repeats 3] [--skip-batched]

Modes: ``sync`` (one step at a time, the default), ``async`` (``async_scheduling=True``: the
next step dispatched before this one's tokens are read) and ``stepsN``
(``num_scheduler_steps=N``: N decode steps per call when every sequence decodes). On this CPU
the "device" is the same two cores as the host, so overlapping the host's work with the step
gains little; multi-step decoding pays the host's per-step work once per N steps.
"""

from __future__ import annotations

import argparse
import platform

from quantized_weights import VARIANTS, batched, single_stream


def mode_knobs(mode: str) -> dict:
    if mode == "sync":
        return {}
    if mode == "async":
        return {"async_scheduling": True}
    if mode.startswith("steps") and mode[5:].isdigit():
        return {"num_scheduler_steps": int(mode[5:])}
    raise ValueError(f"--modes: unknown mode {mode!r} (sync, async, stepsN)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variants", default="float32,int4-gguf", help=", ".join(VARIANTS))
    parser.add_argument("--modes", default="sync,async,steps8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--batch-prompts", type=int, default=64)
    parser.add_argument("--batch-tokens", type=int, default=64)
    parser.add_argument("--skip-batched", action="store_true")
    args = parser.parse_args()
    variants, modes = args.variants.split(","), args.modes.split(",")
    knobs = {mode: mode_knobs(mode) for mode in modes}

    from jaxgen import LLM
    from jaxgen.loaders import load_model

    engines = {}
    for variant in variants:
        loaded = load_model(None, quantization=VARIANTS[variant])
        for mode in modes:
            llm = LLM(
                loaded,
                max_model_len=512,
                kv_cache_memory=512 << 20,
                precompile=not args.skip_batched,
                **knobs[mode],
            )
            single_stream(llm, 8)  # warm
            if not args.skip_batched:
                batched(llm, args.batch_prompts, 4)
            engines[variant, mode] = llm
    best = {key: [0.0, 0.0] for key in engines}
    for _ in range(args.repeats):  # interleaved: drift and other load hit every engine alike
        for key, llm in engines.items():
            best[key][0] = max(best[key][0], single_stream(llm, args.tokens))
            if not args.skip_batched:
                speed = batched(llm, args.batch_prompts, args.batch_tokens)
                best[key][1] = max(best[key][1], speed)
    print(f"{platform.processor() or platform.machine()}, best of {args.repeats}, tok/s")
    print(f"| weights | mode | single stream | x {modes[0]} | batched | x {modes[0]} |")
    print("| --- | --- | --- | --- | --- | --- |")
    for variant in variants:
        base_single, base_batched = best[variant, modes[0]]
        for mode in modes:
            single, batch = best[variant, mode]
            batch_cells = (
                "- | -" if args.skip_batched else f"{batch:.1f} | {batch / base_batched:.3f}"
            )
            print(
                f"| {variant} | {mode} | {single:.1f} | {single / base_single:.3f} | {batch_cells} |"
            )
    for (variant, mode), llm in engines.items():
        stats = llm.stats()
        print(
            f"{variant} {mode}: {stats['steps']} steps, {stats['async_steps']} dispatched ahead, "
            f"{stats['multi_step_calls']} multi-step calls"
        )


if __name__ == "__main__":
    main()
