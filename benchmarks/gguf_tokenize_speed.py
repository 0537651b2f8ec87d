"""Tokenize speed of GGUF tokenizers (llama.cpp's algorithms in Python, ``GGUFTokenizer``)
against llama.cpp's own (llama-cpp-python, when installed) and transformers' tokenizers
pipeline for the same file, on a few-KB prompt: cold (a fresh tokenizer, no word cached)
and warm (the same text again).

    python -m benchmarks.gguf_tokenize_speed [--repeat 20]
"""

from __future__ import annotations

import argparse
import tempfile
import time

from jaxgen.loaders.default_model import default_model_path
from jaxgen.loaders.gguf_reader import GGUFReader
from jaxgen.loaders.gguf_tokenizer import gguf_tokenizer
from tests.loaders.gguf_tokenizer_files import CORPUS, random_strings
from tests.loaders.tokenizer_variants import write_variant


def prompt(target_chars: int = 16_000) -> str:
    """Mostly distinct words (few repeat, so little is served from the per-word cache): the
    test corpus' random mixes of scripts, code, whitespace and digits, then its sentences."""
    text = " ".join(random_strings(2000, [], seed=11)) + "\n".join(CORPUS)
    return text[-target_chars:]


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(name: str, path: str, text: str, repeat: int) -> None:
    fields = GGUFReader(path).fields
    cold = best(lambda: gguf_tokenizer(fields).encode(text), 3) - best(
        lambda: gguf_tokenizer(fields), 3
    )
    tokenizer = gguf_tokenizer(fields)
    ids = tokenizer.encode(text)
    warm = best(lambda: tokenizer.encode(text), repeat)
    row = f"{name:<14} {len(text):>6} chars {len(ids):>5} tokens  jaxgen cold {cold * 1e3:6.1f} ms"
    row += f" ({len(ids) / cold / 1e3:5.0f}k tok/s)  warm {warm * 1e3:6.1f} ms"
    row += f" ({len(ids) / warm / 1e3:5.0f}k tok/s)"
    try:
        import llama_cpp

        llm = llama_cpp.Llama(path, vocab_only=True, verbose=False)
        data = text.encode()
        native = best(lambda: llm.tokenize(data, add_bos=True, special=True), repeat)
        row += f"  llama.cpp {native * 1e3:6.1f} ms"
    except ImportError:
        pass
    hf = tokenizer.to_transformers()
    row += f"  transformers {best(lambda: hf.encode(text), repeat) * 1e3:6.1f} ms"
    print(row, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    text = prompt()
    measure("default-model", default_model_path(), text, args.repeat)
    with tempfile.TemporaryDirectory() as directory:
        for name in ("spm-llama", "spm-gemma", "bpe-llama-bpe", "bpe-qwen2", "bpe-tekken"):
            measure(name, write_variant(name, directory), text, args.repeat)


if __name__ == "__main__":
    main()
