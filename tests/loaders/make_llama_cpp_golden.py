"""Records llama.cpp's token ids for every tokenizer variant's GGUF (tokenizer_variants) and the
default model's, over each one's corpus, into tests/loaders/data/llama_cpp_token_ids.json; the
tests compare jaxgen against it without llama.cpp. Needs llama-cpp-python:

    python -m tests.loaders.make_llama_cpp_golden
"""

from __future__ import annotations

import json
import tempfile

from tests.loaders.tokenizer_variants import (
    GOLDEN,
    VARIANTS,
    corpus,
    specials_of,
    tokenizer_digest,
    write_variant,
)

MODES = ((True, True), (False, False))  # (add_special, parse_special) pairs recorded


def llama_cpp_ids(path: str, texts: list[str]) -> list[list[list[int]]]:
    import llama_cpp

    llm = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    return [[llm.tokenize(t.encode(), add_bos=a, special=p) for a, p in MODES] for t in texts]


def record(name: str, path: str) -> dict:
    texts = corpus(specials_of(path))
    return {"digest": tokenizer_digest(path), "texts": texts, "ids": llama_cpp_ids(path, texts)}


def main() -> None:
    from jaxgen.loaders.default_model import default_model_path

    golden = {"modes": MODES, "variants": {}}
    with tempfile.TemporaryDirectory() as directory:
        for name in VARIANTS:
            golden["variants"][name] = record(name, write_variant(name, directory))
            print(name, flush=True)
    golden["variants"]["default-model"] = record("default-model", default_model_path())
    with open(GOLDEN, "w", encoding="utf-8") as handle:
        json.dump(golden, handle, ensure_ascii=False, separators=(",", ":"))
    print("wrote", GOLDEN)


if __name__ == "__main__":
    main()
