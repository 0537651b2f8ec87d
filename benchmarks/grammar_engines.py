"""llguidance against xgrammar on the default model's tokenizer: tokenizer set-up, compile time of
one nested JSON schema, and the host time to fill one row's token bitmask, over 16 random walks
of 64 tokens through the grammar (each library walks its own allowed tokens).

xgrammar is not a jaxgen dependency (it imports torch); install it aside to run this:

    pip install --target /tmp/xgr --no-deps xgrammar apache-tvm-ffi
    PYTHONPATH=/tmp/xgr:$PYTHONPATH python benchmarks/grammar_engines.py
"""

from __future__ import annotations

import json
import time

import llguidance
import llguidance.hf
import llguidance.numpy
import numpy as np

from benchmarks.structured_output import SCHEMA
from jaxgen.loaders.default_model import default_model_path
from jaxgen.loaders.tokenizer import load_tokenizer

WALKS, STEPS, CANDIDATES = 16, 64, 300


def allowed_ids(row: np.ndarray, vocab_size: int) -> np.ndarray:
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")[:vocab_size]
    return np.nonzero(bits)[0]


def time_llguidance(tokenizer) -> dict:
    start = time.perf_counter()
    llg_tokenizer = llguidance.hf.from_tokenizer(
        tokenizer, n_vocab=len(tokenizer), eos_token=[tokenizer.eos_token_id]
    )
    setup = time.perf_counter() - start
    start = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        SCHEMA, defaults={"whitespace_flexible": False}
    )
    pristine = llguidance.LLMatcher(llg_tokenizer, grammar, log_level=0)
    compile_s = time.perf_counter() - start
    rng = np.random.default_rng(0)
    matchers = [pristine.deep_copy() for _ in range(WALKS)]
    mask = llguidance.numpy.allocate_token_bitmask(WALKS, llg_tokenizer.vocab_size)
    total, rows = 0.0, 0
    for _ in range(STEPS):
        live = [(i, m) for i, m in enumerate(matchers) if not m.is_stopped()]
        start = time.perf_counter()
        for i, matcher in live:
            llguidance.numpy.fill_next_token_bitmask(matcher, mask, i)
        total += time.perf_counter() - start
        rows += len(live)
        for i, matcher in live:
            ids = allowed_ids(mask[i], llg_tokenizer.vocab_size)
            matcher.consume_token(int(rng.choice(ids[:CANDIDATES])))
    return dict(setup_s=setup, compile_s=compile_s, mask_us=1e6 * total / rows, rows=rows)


def time_xgrammar(tokenizer) -> dict:
    import xgrammar

    start = time.perf_counter()
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    setup = time.perf_counter() - start
    compiler = xgrammar.GrammarCompiler(info, max_threads=1)
    start = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    compile_s = time.perf_counter() - start
    rng = np.random.default_rng(0)
    matchers = [xgrammar.GrammarMatcher(compiled) for _ in range(WALKS)]
    mask = xgrammar.allocate_token_bitmask(WALKS, info.vocab_size)
    total, rows = 0.0, 0
    for _ in range(STEPS):
        live = [(i, m) for i, m in enumerate(matchers) if not m.is_terminated()]
        start = time.perf_counter()
        for i, matcher in live:
            matcher.fill_next_token_bitmask(mask, i)
        total += time.perf_counter() - start
        rows += len(live)
        for i, matcher in live:
            ids = allowed_ids(mask[i].numpy(), info.vocab_size)
            matcher.accept_token(int(rng.choice(ids[:CANDIDATES])))
    return dict(setup_s=setup, compile_s=compile_s, mask_us=1e6 * total / rows, rows=rows)


def main() -> None:
    tokenizer = load_tokenizer(default_model_path())
    for name, run in (("llguidance", time_llguidance), ("xgrammar", time_xgrammar)) * 2:
        result = run(tokenizer)
        print(
            f"{name:>10}: tokenizer {result['setup_s']:.2f} s  compile "
            f"{1e3 * result['compile_s']:.1f} ms  mask {result['mask_us']:.1f} us/row "
            f"({result['rows']} rows)",
            flush=True,
        )


if __name__ == "__main__":
    main()
