"""What an object's conditional property dependencies cost to compile once rewritten into
keywords llguidance enforces (``jaxgen.structured_outputs.dependencies``): each makes an
``anyOf`` llguidance expands into alternatives of the whole object, so ``n`` of them make
``2**n``. Sets ``MAX_CONDITIONAL_DEPENDENCIES``.

For each ``n``, an object of ``2n`` integer properties with ``n`` dependencies ``p{i}`` ->
``p{i+n}`` (``dependentRequired``, or ``dependentSchemas`` requiring and bounding ``p{i+n}``),
read strictly (``strict_schema``), is rewritten without the bound, compiled by llguidance on
the default model's tokenizer and dry-run (``GrammarCompiler.dry_run``); the best of
``--repeats`` is reported, with the mean host time of a token's bitmask over a valid instance.

    python benchmarks/schema_dependencies.py [--max-n 8] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def schema(n: int, form: str) -> dict:
    properties = {f"p{i}": {"type": "integer"} for i in range(2 * n)}
    if form == "dependentRequired":
        dependencies = {f"p{i}": [f"p{i + n}"] for i in range(n)}
    else:
        dependencies = {
            f"p{i}": {"properties": {f"p{i + n}": {"minimum": i}}, "required": [f"p{i + n}"]}
            for i in range(n)
        }
    return {"type": "object", "properties": properties, form: dependencies}


def measure(compiler, n: int, form: str, repeats: int) -> dict:
    import llguidance

    from jaxgen.engine.structured.grammar_masks import JSON_OPTIONS, parser_limits
    from jaxgen.structured_outputs import StructuredOutputsParams
    from jaxgen.structured_outputs.dependencies import enforced_dependencies
    from jaxgen.structured_outputs.strict_schemas import strict_schema

    original = schema(n, form)
    rewritten = enforced_dependencies(strict_schema(original), max_conditional=n)
    constraint = StructuredOutputsParams(json=original)
    best, matcher = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        text = llguidance.LLMatcher.grammar_from_json_schema(rewritten, defaults=JSON_OPTIONS)
        matcher = llguidance.LLMatcher(
            compiler.llg_tokenizer, text, log_level=0, limits=parser_limits()
        )
        if matcher.is_error():
            return {"n": n, "form": form, "error": matcher.get_error()}
        compiler.dry_run(constraint, matcher)
        best = min(best, time.perf_counter() - start)
    instance = json.dumps({f"p{i}": i for i in range(2 * n)}, separators=(",", ":"))
    tokens = compiler.tokenizer.encode(instance, add_special_tokens=False)
    mask = np.zeros(compiler.mask_width, np.int32)
    start = time.perf_counter()
    for token in tokens:
        matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        matcher.consume_token(token)
    mask_ms = (time.perf_counter() - start) / len(tokens) * 1e3
    return {"n": n, "form": form, "compile_ms": round(best * 1e3, 1), "mask_ms": round(mask_ms, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-n", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the rows here too")
    args = parser.parse_args()

    from jaxgen.engine.structured.grammar_masks import GrammarCompiler
    from jaxgen.loaders.default_model import default_model_path
    from jaxgen.loaders.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(default_model_path())
    compiler = GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    assert compiler.llg_tokenizer is not None  # built before anything is timed
    rows = []
    for form in ("dependentRequired", "dependentSchemas"):
        for n in range(args.max_n + 1):
            rows.append(measure(compiler, n, form, args.repeats))
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
