"""Constrained decoding's cost: 32 concurrent chat requests on the default model, half of them
constrained by a JSON schema, against the same load unconstrained, alternating in one process
(warm). Every request makes exactly ``--output-len`` tokens (``ignore_eos``; the schema needs more
than that to complete), so the two loads do the same work but for the masks.

Prints output tokens per second of each load, their ratio (constrained / unconstrained), and the
host time spent filling bitmasks as a share of the step time (and per masked row).

    python benchmarks/structured_output.py [--num-prompts 32] [--output-len 64] [--passes 3]
"""

from __future__ import annotations

import argparse
import time

from jaxgen import LLM, SamplingParams

# Needs well over 64 tokens to complete: objects, arrays, enums and bounded numbers throughout.
SCHEMA = {
    "type": "object",
    "properties": {
        "people": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 12},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                    "role": {"enum": ["admin", "user", "guest"]},
                    "score": {"type": "number", "minimum": 0, "maximum": 1},
                },
                "required": ["name", "age", "role", "score"],
                "additionalProperties": False,
            },
            "minItems": 12,
        }
    },
    "required": ["people"],
    "additionalProperties": False,
}


def run(llm, prompts, params) -> dict:
    before = llm.stats()
    start = time.perf_counter()
    outputs = llm.chat(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    after = llm.stats()
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    delta = {key: after[key] - before[key] for key in ("step_time_s", "grammar_mask_s", "steps")}
    delta["grammar_masked_rows"] = after["grammar_masked_rows"] - before["grammar_masked_rows"]
    delta["compiles"] = after["compiles"] - before["compiles"]
    return dict(seconds=elapsed, tokens=tokens, tok_s=tokens / elapsed, **delta)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    llm = LLM(args.model, max_model_len=512, max_rolling_batch_size=args.num_prompts)
    prompts = [
        [{"role": "user", "content": f"List a few people as JSON, starting with number {i}."}]
        for i in range(args.num_prompts)
    ]

    def params(i: int, constrained: bool) -> SamplingParams:
        return SamplingParams(
            max_tokens=args.output_len,
            temperature=0.7,
            seed=i,
            ignore_eos=True,
            structured_outputs={"json": SCHEMA} if constrained else None,
        )

    loads = {
        "unconstrained": [params(i, False) for i in range(args.num_prompts)],
        "half constrained": [params(i, i % 2 == 0) for i in range(args.num_prompts)],
    }
    for load in loads.values():  # warm-up: compiles both sets of shapes
        run(llm, prompts, load)
    results: dict[str, list[dict]] = {name: [] for name in loads}
    for index in range(args.passes):
        for name, load in loads.items():
            result = run(llm, prompts, load)
            results[name].append(result)
            print(
                f"pass {index} {name:>16}: {result['seconds']:.2f} s  {result['tok_s']:.1f} tok/s  "
                f"tokens {result['tokens']}  steps {result['steps']}  "
                f"mask {1e3 * result['grammar_mask_s']:.1f} ms  compiles {result['compiles']}",
                flush=True,
            )
    paired = [
        c["tok_s"] / u["tok_s"]
        for u, c in zip(results["unconstrained"], results["half constrained"], strict=True)
    ]
    print(
        "paired ratios (constrained / unconstrained, same pass): "
        + ", ".join(f"{r:.3f}" for r in paired)
    )
    best = {name: max(r["tok_s"] for r in rs) for name, rs in results.items()}
    constrained = results["half constrained"]
    mask_s = sum(r["grammar_mask_s"] for r in constrained)
    step_s = sum(r["step_time_s"] for r in constrained)
    rows = sum(r["grammar_masked_rows"] for r in constrained)
    print(
        f"throughput: unconstrained {best['unconstrained']:.1f} tok/s, half constrained "
        f"{best['half constrained']:.1f} tok/s, ratio of the best {best['half constrained'] / best['unconstrained']:.3f}, "
        f"mean paired ratio {sum(paired) / len(paired):.3f}"
    )
    print(
        f"host mask time: {100 * mask_s / step_s:.2f}% of step time "
        f"({1e6 * mask_s / max(rows, 1):.0f} us per masked row, {rows} rows)"
    )


if __name__ == "__main__":
    main()
