"""Teacher-forced agreement of quantised weights and 8-bit KV pools with the float32 model (the
default GGUF dequantised): top-1 agreement and mean |Δ log-probability| of the float model's
greedy tokens over 32 chat prompts x 64 tokens.

    python benchmarks/quantized_accuracy.py [--prompts 32] [--tokens 64]
"""

from __future__ import annotations

import argparse
import dataclasses


def requantised(loaded, spec):
    """``loaded`` with every ``Linear`` kernel quantised per ``spec`` (embedding and head kept):
    int4 variants other than the default's, which on this model would reproduce the Q4_1 file
    exactly (its weights already sit on a 16-level grid per group of 32)."""
    import numpy as np
    from flax import nnx

    from jaxgen.quantization import quantize_kernel

    leaves = []
    for path, var in nnx.to_flat_state(loaded.params):
        if path[-1] == "kernel":
            var = var.replace(quantize_kernel(np.asarray(var.get_value()), spec))
        leaves.append((path, var))
    return dataclasses.replace(loaded, params=nnx.from_flat_state(leaves))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--cases", default="all", help="all, int4-variants, w8a8 or w4a8")
    args = parser.parse_args()

    from jaxgen import LLM
    from jaxgen.evaluation.agreement import PROMPTS, greedy_sequences, teacher_forced_agreement
    from jaxgen.loaders import load_model
    from jaxgen.quantization import QuantizationSpec

    reference = load_model(None, quantization="none")
    llm = LLM(reference, max_model_len=256, kv_cache_memory=128 << 20)
    sequences, first = greedy_sequences(llm, PROMPTS[: args.prompts], args.tokens)
    print("| variant | tokens | top-1 agreement | mean abs dlogprob | max abs dlogit |")
    print("| --- | --- | --- | --- | --- |")
    cases = [("int8 weights", "int8", "auto"), ("int8 weights + activations (w8a8)", "w8a8", "auto"),
             ("int4 g32 weights", "int4", "auto"),
             ("int4 GGUF kept (Q4_1)", "auto", "auto"),
             ("int4 GGUF kept + int8 activations (w4a8)", "w4a8", "auto"), ("int8 KV", None, "int8"),
             ("fp8 KV", None, "fp8")]  # fmt: skip
    variants = {
        "int4 g32 symmetric weights": QuantizationSpec(kind="int4", group_size=32),
        "int4 g64 with mins weights (g128 does not divide 576)": QuantizationSpec(
            kind="int4", group_size=64, asymmetric=True
        ),
    }
    if args.cases == "int4-variants":
        cases = [(name, spec, "auto") for name, spec in variants.items()]
    elif args.cases == "w8a8":
        cases = cases[:2]
    elif args.cases == "w4a8":
        cases = cases[3:5]
    for name, quantization, kv in cases:
        if isinstance(quantization, QuantizationSpec):
            candidate = requantised(reference, quantization)
        elif quantization is None:
            candidate = reference
        else:
            candidate = load_model(None, quantization=quantization)
        backend = "reference" if kv != "auto" else "auto"
        result = teacher_forced_agreement(
            reference, candidate, sequences, first, backend=backend, candidate_kv_cache_dtype=kv
        )
        print(
            f"| {name} | {result.tokens} | {result.top1:.4f} | "
            f"{result.mean_abs_logprob_delta:.4f} | {result.max_abs_logit_delta:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
