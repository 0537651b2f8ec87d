"""JSONSchemaBench through jaxgen's structured output: which schemas jaxgen accepts against
llguidance alone, and whether the outputs it generates are valid.

The schemas are the benchmark's ten sets of real-world JSON schemas (function signatures,
GitHub schemas from trivial to ultra, Kubernetes, Snowplow, SchemaStore, Washington Post), the
``data/`` folder of https://github.com/guidance-ai/jsonschemabench (the same sets as the
Hugging Face dataset ``epfl-dlab/JSONSchemaBench``). Up to ``--per-set`` schemas are sampled
from each set (seeded). For each one:

- llguidance alone: its JSON compiler with its own defaults (what vLLM's ``guidance`` backend
  does), and with ``lenient`` (``coerce_one_of`` and unimplemented keywords left out);
- jaxgen: ``GrammarCompiler.build`` on ``StructuredOutputsParams(json=schema)`` with the
  default limits: limits, strict rewriting (``strict=True``, the default), llguidance with
  jaxgen's lenient retry, the dry run; and the same with ``strict=False``.

"refused by jaxgen, accepted by llguidance" counts what jaxgen refuses that llguidance alone
accepts (the count to keep at 0). Then up to ``--generate-per-set`` accepted schemas of each set
are generated with the default model (chat, sampled at ``--temperature``, seeded per schema;
greedy decoding of a 135M model often repeats a string until ``--max-tokens``), and every output that
finished (``finish_reason`` "stop") is validated against the original schema with
``jsonschema`` (its format checker included), apart for schemas whose grammar relaxed a
keyword.

    git clone --depth 1 https://github.com/guidance-ai/jsonschemabench /tmp/jsonschemabench
    python benchmarks/jsonschemabench.py --data /tmp/jsonschemabench/data [--per-set 40]
        [--generate-per-set 10] [--max-tokens 512] [--temperature 0.7] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import time

SETS = (
    "Glaiveai2K",
    "Github_trivial",
    "Github_easy",
    "Snowplow",
    "Github_medium",
    "Kubernetes",
    "WashingtonPost",
    "Github_hard",
    "JsonSchemaStore",
    "Github_ultra",
)
PROMPT = "Reply with one JSON value only."


def sample(data: str, per_set: int, seed: int) -> list[dict]:
    """Up to ``per_set`` schemas of each set, seeded; files that are not a JSON object are
    left out (and counted)."""
    rng = random.Random(seed)
    cases = []
    for name in SETS:
        files = sorted(os.listdir(os.path.join(data, name)))
        for file in sorted(rng.sample(files, min(per_set, len(files)))):
            with open(os.path.join(data, name, file), encoding="utf-8") as handle:
                try:
                    schema = json.load(handle)
                except ValueError:
                    schema = None
            cases.append(dict(set=name, file=file, schema=schema))
    return cases


def llguidance_error(tokenizer, schema, options: dict) -> str | None:
    """llguidance alone on ``schema``: None when it compiles, else its error."""
    import llguidance

    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=options)
    except ValueError as error:
        return str(error)
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    return matcher.get_error() if matcher.is_error() else None


def jaxgen_result(compiler, schema, strict: bool) -> tuple[str | None, list[str]]:
    """jaxgen's own path: (None or the refusal, the keywords relaxed)."""
    from jaxgen.structured_outputs import StructuredOutputsParams
    from jaxgen.structured_outputs.relaxations import relaxed_keywords

    try:
        params = StructuredOutputsParams(json=schema, strict=strict)
        return None, relaxed_keywords(compiler.build(params))
    except ValueError as error:
        return str(error), []


def compile_all(compiler, cases: list[dict]) -> None:
    from jaxgen.engine.structured.grammar_masks import JSON_OPTIONS

    tokenizer = compiler.llg_tokenizer
    for case in cases:
        schema = case["schema"]
        if not isinstance(schema, dict):
            case.update(llg="not a JSON object", llg_lenient="not a JSON object")
            case.update(jaxgen="not a JSON object", jaxgen_lenient="not a JSON object")
            case["relaxed"] = []
            continue
        start = time.perf_counter()
        case["llg"] = llguidance_error(tokenizer, schema, JSON_OPTIONS)
        case["llg_lenient"] = llguidance_error(tokenizer, schema, {**JSON_OPTIONS, "lenient": True})
        case["jaxgen"], case["relaxed"] = jaxgen_result(compiler, schema, strict=True)
        case["jaxgen_lenient"], _ = jaxgen_result(compiler, schema, strict=False)
        case["compile_s"] = round(time.perf_counter() - start, 4)


def validation_error(schema: dict, text: str) -> str | None:
    """None when ``text`` is JSON valid against ``schema``, else why not."""
    import jsonschema

    try:
        instance = json.loads(text)
    except ValueError as error:
        return f"not JSON: {error}"
    try:
        validator = jsonschema.validators.validator_for(schema)
        checker = validator.FORMAT_CHECKER
        error = jsonschema.exceptions.best_match(
            validator(schema, format_checker=checker).iter_errors(instance)
        )
    except Exception as exc:  # an unresolvable remote $ref, an invalid schema
        return f"could not validate: {type(exc).__name__}: {str(exc)[:200]}"
    return None if error is None else error.message[:300]


def generate_some(llm, cases: list[dict], per_set: int, max_tokens: int, temperature: float):
    """Generates for up to ``per_set`` accepted schemas of each set; returns the seconds."""
    from jaxgen import SamplingParams

    chosen, taken = [], collections.Counter()
    for case in cases:
        if case["jaxgen"] is None and taken[case["set"]] < per_set:
            taken[case["set"]] += 1
            chosen.append(case)
    if not chosen:
        return 0.0
    conversations = [[{"role": "user", "content": PROMPT}] for _ in chosen]
    params = [
        SamplingParams(
            temperature=temperature,
            seed=seed,
            max_tokens=max_tokens,
            structured_outputs={"json": case["schema"]},
        )
        for seed, case in enumerate(chosen)
    ]
    start = time.perf_counter()
    outputs = llm.chat(conversations, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    for case, output in zip(chosen, outputs, strict=True):
        case["finish_reason"] = output.finish_reason
        case["tokens"] = len(output.token_ids)
        if output.finish_reason == "stop":
            case["invalid"] = validation_error(case["schema"], output.text)
            if case["invalid"]:
                case["text"] = output.text[:2000]
    return seconds


def summary(cases: list[dict]) -> list[dict]:
    """Per set and in all: the counts the report tabulates."""
    rows = []
    for name in (*SETS, "all"):
        mine = [c for c in cases if name in ("all", c["set"])]
        generated = [c for c in mine if "finish_reason" in c]
        finished = [c for c in generated if c["finish_reason"] == "stop"]
        enforced = [c for c in finished if not c["relaxed"]]
        rows.append(
            dict(
                set=name,
                schemas=len(mine),
                llguidance=sum(c["llg"] is None for c in mine),
                llguidance_lenient=sum(c["llg_lenient"] is None for c in mine),
                jaxgen=sum(c["jaxgen"] is None for c in mine),
                jaxgen_not_strict=sum(c["jaxgen_lenient"] is None for c in mine),
                relaxed=sum(c["jaxgen"] is None and bool(c["relaxed"]) for c in mine),
                refused_by_jaxgen_only=sum(
                    c["jaxgen"] is not None and c["llg"] is None for c in mine
                ),
                refused_vs_lenient=sum(
                    c["jaxgen"] is not None and c["llg_lenient"] is None for c in mine
                ),
                strict_only_refused=sum(
                    c["jaxgen"] is not None and c["jaxgen_lenient"] is None for c in mine
                ),
                generated=len(generated),
                finished=len(finished),
                invalid_enforced=sum(bool(c["invalid"]) for c in enforced),
                finished_relaxed=len(finished) - len(enforced),
                invalid_relaxed=sum(bool(c["invalid"]) for c in finished if c["relaxed"]),
                errors=sum(c["finish_reason"] == "error" for c in generated),
            )
        )
    return rows


COLUMNS = {
    "set": "set",
    "schemas": "schemas",
    "llguidance": "llguidance",
    "llguidance_lenient": "llguidance lenient",
    "jaxgen": "jaxgen",
    "relaxed": "of them relaxed",
    "refused_by_jaxgen_only": "refused by jaxgen, not llguidance",
    "strict_only_refused": "refused strict only",
    "generated": "generated",
    "finished": "finished",
    "invalid_enforced": "invalid (enforced)",
    "invalid_relaxed": "invalid (relaxed)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="the benchmark's data/ folder")
    parser.add_argument("--per-set", type=int, default=40)
    parser.add_argument("--generate-per-set", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the counts and every schema's result here")
    args = parser.parse_args()

    from jaxgen import LLM

    cases = sample(args.data, args.per_set, args.seed)
    llm = LLM(None, max_model_len=args.max_tokens + 128)
    compiler = llm.engine.grammars.compiler
    start = time.perf_counter()
    compile_all(compiler, cases)
    compile_s = time.perf_counter() - start
    generate_s = generate_some(llm, cases, args.generate_per_set, args.max_tokens, args.temperature)
    rows = summary(cases)
    print("| " + " | ".join(COLUMNS.values()) + " |")
    print("|" + " --- |" * len(COLUMNS))
    for row in rows:
        print("| " + " | ".join(str(row[key]) for key in COLUMNS) + " |")
    print(f"\ncompiling: {compile_s:.1f} s; generating: {generate_s:.1f} s")
    for case in cases:
        if case["jaxgen"] is not None and (case["llg"] is None or case["llg_lenient"] is None):
            print(f"refused by jaxgen: {case['set']}/{case['file']}: {case['jaxgen'][:300]}")
        if case.get("invalid"):
            relaxed = f" (relaxed {case['relaxed']})" if case["relaxed"] else ""
            print(f"invalid{relaxed}: {case['set']}/{case['file']}: {case['invalid'][:300]}")
    if args.json:
        for case in cases:
            case.pop("schema")
        totals = dict(compile_s=round(compile_s, 1), generate_s=round(generate_s, 1))
        with open(args.json, "w") as out:
            json.dump(dict(args=vars(args), **totals, sets=rows, cases=cases), out, indent=1)


if __name__ == "__main__":
    main()
