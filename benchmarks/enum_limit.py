"""What a JSON Schema's enum values cost to compile: llguidance's compile time, the peak memory it
adds, and the host time of one token bitmask, against the total number of enum values, how many
enums hold them and how long each value is, on the default model's tokenizer. Sets the default
of ``StructuredOutputLimits.max_enum_values``.

Each case runs in its own process (peak RSS, ``ru_maxrss``, is per process): the tokenizer and a
trivial grammar are built first, then the case's schema, an object of ``enums`` required
properties, each an enum of ``values / enums`` distinct strings of ``length`` characters, goes
through jaxgen's own path (``GrammarCompiler.build``: limits, strict rewriting, llguidance, the
dry run). The bitmask time is the mean over the first 16 tokens of a walk into the values.
``--choices`` measures ``choice`` constraints of as many strings instead (``enums`` is then 0).

    python benchmarks/enum_limit.py [--values 1000,5000,20000,100000] [--enums 1,20,50]
        [--lengths 8,40] [--choices] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time

WALK_TOKENS = 16


def strings(values: int, length: int, seed: int = 0) -> list[str]:
    """``values`` distinct random strings of ``length`` characters, sorted."""
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789_-"
    seen: set[str] = set()
    while len(seen) < values:
        seen.add("".join(rng.choice(alphabet) for _ in range(length)))
    return sorted(seen)


def schema(values: int, enums: int, length: int) -> dict:
    """An object of ``enums`` required properties sharing ``values`` distinct strings."""
    strings_ = strings(values, length)
    per = -(-values // enums)
    properties = {f"p{i}": {"enum": strings_[i * per : (i + 1) * per]} for i in range(enums)}
    return {"type": "object", "properties": properties, "required": list(properties)}


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run_case(values: int, enums: int, length: int) -> dict:
    """One case, in this process: compile time, added peak RSS, mean bitmask time."""
    import numpy as np

    from jaxgen.engine.structured.grammar_masks import GrammarCompiler
    from jaxgen.loaders.default_model import default_model_path
    from jaxgen.loaders.tokenizer import load_tokenizer
    from jaxgen.structured_outputs import StructuredOutputsParams
    from jaxgen.structured_outputs.limits import StructuredOutputLimits

    tokenizer = load_tokenizer(default_model_path())
    compiler = GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    compiler.compile(StructuredOutputsParams(json={"type": "object"}))  # tokenizer, threads
    if enums:
        case = schema(values, enums, length)
        params = StructuredOutputsParams(json=case)
        first = json.dumps({"p0": case["properties"]["p0"]["enum"][0]}, separators=(",", ":"))
    else:
        case = strings(values, length)
        params = StructuredOutputsParams(choice=case)
        first = case[0]
    text = json.dumps(case)
    unlimited = StructuredOutputLimits(max_constraint_bytes=1 << 30, max_enum_values=1 << 30)
    before = peak_mib()
    start = time.perf_counter()
    error = None
    try:
        matcher = compiler.compile(params, unlimited)
    except ValueError as exc:
        error, matcher = str(exc)[:200], None
    compile_s = time.perf_counter() - start
    added = peak_mib() - before
    mask_us = None
    if matcher is not None:
        probe = matcher.deep_copy()
        mask = np.zeros(compiler.mask_width, np.int32)
        walk = tokenizer.encode(first, add_special_tokens=False)
        total = 0.0
        for token in walk[:WALK_TOKENS]:
            start = time.perf_counter()
            probe.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
            total += time.perf_counter() - start
            if not probe.consume_token(token):
                break
        mask_us = 1e6 * total / min(len(walk), WALK_TOKENS)
    return dict(
        values=values,
        enums=enums,
        length=length,
        constraint_kib=round(len(text) / 1024, 1),
        compile_s=round(compile_s, 4),
        added_peak_mib=round(added, 1),
        mask_us=None if mask_us is None else round(mask_us, 1),
        error=error,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--values", default="1000,5000,20000,100000")
    parser.add_argument("--enums", default="1,20,50")
    parser.add_argument("--lengths", default="8,40")
    parser.add_argument("--choices", action="store_true", help="choice constraints instead")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # values,enums,length: one case, here
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_case(*map(int, args.one.split(",")))))
        return
    rows = []
    print(
        "| values | enums | value length | constraint KiB | compile s | added peak MiB | mask us |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for length in map(int, args.lengths.split(",")):
        for values in map(int, args.values.split(",")):
            for enums in [0] if args.choices else map(int, args.enums.split(",")):
                one = f"{values},{enums},{length}"
                result = subprocess.run(
                    [sys.executable, __file__, "--one", one],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                row = json.loads(result.stdout.strip().splitlines()[-1])
                rows.append(row)
                cells = [row[k] for k in ("values", "enums", "length", "constraint_kib")]
                cells += [row["compile_s"], row["added_peak_mib"], row["mask_us"] or row["error"]]
                print("| " + " | ".join(str(cell) for cell in cells) + " |", flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
