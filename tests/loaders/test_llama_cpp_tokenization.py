"""GGUF tokenizers give llama.cpp's ids (``llama_tokenize(text, add_special, parse_special)``),
id for id, for every tokenizer variant (tokenizer_variants) and the default model.

The reference ids were recorded from llama-cpp-python (tests/loaders/make_llama_cpp_golden.py)
into tests/loaders/data/llama_cpp_token_ids.json with a digest of each file's tokenizer fields,
so a synthetic file that changes is reported, not compared; where llama_cpp is installed the ids
are also compared live. transformers' GGUF tokenizer is compared where it tokenizes as
llama.cpp does (byte-level BPE with GPT-2's and Qwen 2's splits; elsewhere it does not:
SentencePiece's space prefix and ``add_space_prefix = false``, Llama 3's and tekken's default
BOS, SmolLM's and Falcon's digit and punctuation splits).
"""

from __future__ import annotations

import functools
import json
import os
import unicodedata

import pytest

from jaxgen.loaders.gguf_reader import GGUFReader
from jaxgen.loaders.gguf_tokenizer import gguf_tokenizer
from tests.loaders.gguf_tokenizer_files import write_tokenizer_gguf
from tests.loaders.tokenizer_variants import (
    FAMILY_VARIANTS,
    GOLDEN,
    VARIANTS,
    corpus,
    specials_of,
    tokenizer_digest,
    write_variant,
)

REGENERATE = "regenerate it with `python -m tests.loaders.make_llama_cpp_golden`"


@functools.cache
def golden() -> dict:
    with open(GOLDEN, encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def variant_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tokenizer-variants")


def variant_path(name: str, directory, smollm2_gguf=None) -> str:
    if name == "default-model":
        return smollm2_gguf
    path = os.path.join(directory, f"{name}.gguf")
    return path if os.path.exists(path) else write_variant(name, str(directory))


def load(path: str):
    return gguf_tokenizer(GGUFReader(path).fields)


def assert_llama_cpp_ids(tokenizer, texts, expected) -> None:
    modes = golden()["modes"]
    wrong = []
    for text, ids in zip(texts, expected, strict=True):
        for (add_special, parse_special), want in zip(modes, ids, strict=True):
            got = tokenizer.encode(
                text, add_special_tokens=add_special, parse_special=parse_special
            )
            if got != want:
                wrong.append((text, add_special, parse_special, got, want))
    assert not wrong, f"{len(wrong)} of {len(texts) * len(modes)} differ, first: {wrong[:2]}"


@pytest.mark.filterwarnings("ignore:GGUF file has no tokenizer.ggml.pre")
@pytest.mark.parametrize("name", [*VARIANTS, "default-model"])
def test_ids_equal_llama_cpp(name, variant_dir, smollm2_gguf):
    """Every string of the variant's corpus (pieces, scripts, whitespace, code, URLs, HTML,
    special tokens alone and inside text), with and without special tokens."""
    recorded = golden()["variants"][name]
    path = variant_path(name, variant_dir, smollm2_gguf)
    assert tokenizer_digest(path) == recorded["digest"], f"{name}'s file changed: {REGENERATE}"
    tokenizer = load(path)
    assert recorded["texts"] == corpus(specials_of(path)), f"corpus changed: {REGENERATE}"
    assert_llama_cpp_ids(tokenizer, recorded["texts"], recorded["ids"])


@pytest.mark.filterwarnings("ignore:GGUF file has no tokenizer.ggml.pre")
@pytest.mark.parametrize("name", [*VARIANTS, "default-model"])
def test_decode_round_trips(name, variant_dir, smollm2_gguf):
    """decode(encode(text)) is the text again, special tokens added and skipped (texts holding
    no special token: after one, llama.cpp's SentencePiece prefixes a space; nor, for
    SentencePiece, its escaped space U+2581, which decodes as a space)."""
    tokenizer = load(variant_path(name, variant_dir, smollm2_gguf))
    specials = list(tokenizer.get_added_vocab())
    if tokenizer.vocab.model == "llama":
        specials.append("\u2581")
    texts = [t for t in golden()["variants"][name]["texts"] if not any(s in t for s in specials)]
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=True)
        assert tokenizer.decode(ids, skip_special_tokens=True) == text


@pytest.mark.parametrize("name", [*FAMILY_VARIANTS, "default-model"])
def test_ids_equal_llama_cpp_live(name, variant_dir, smollm2_gguf):
    """The recorded ids are what the installed llama.cpp gives (skipped without llama_cpp)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    path = variant_path(name, variant_dir, smollm2_gguf)
    llm = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    tokenizer = load(path)
    texts = corpus(specials_of(path))
    modes = golden()["modes"]
    live = [[llm.tokenize(t.encode(), add_bos=a, special=p) for a, p in modes] for t in texts]
    assert_llama_cpp_ids(tokenizer, texts, live)


@pytest.mark.parametrize("name", ["bpe-qwen2", "bpe-gpt-2", "default-model"])
def test_transformers_agrees_where_it_tokenizes_as_llama_cpp(name, variant_dir, smollm2_gguf):
    """transformers' GGUF tokenizer, on the variants where it splits as llama.cpp does (the
    default model: where llama.cpp agrees, i.e. texts without digit runs)."""
    from transformers import AutoTokenizer

    path = variant_path(name, variant_dir, smollm2_gguf)
    reference = AutoTokenizer.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path)
    )
    recorded = golden()["variants"][name]
    compared = 0
    for text, ids in zip(recorded["texts"], recorded["ids"], strict=True):
        if name == "default-model" and any(unicodedata.category(c)[0] == "N" for c in text):
            continue  # SmolLM's split: llama.cpp isolates every digit, transformers does not
        assert reference.encode(text, add_special_tokens=True) == ids[0], text
        compared += 1
    assert compared > 100


def test_gemma_style_file_adds_no_space_prefix(variant_dir):
    """``add_space_prefix = false`` (Gemma's files): the first word is not given a space, so
    "The" is not "▁The" (the issue's [2, 669, ...] against llama.cpp's [2, 818, ...])."""
    gemma = load(variant_path("spm-gemma", variant_dir))
    llama = load(variant_path("spm-llama", variant_dir))
    text = "The capital of France is"
    first_gemma = gemma.convert_ids_to_tokens(gemma.encode(text)[1:])
    first_llama = llama.convert_ids_to_tokens(llama.encode(text)[1:])
    assert first_llama[0].startswith("▁") and not first_gemma[0].startswith("▁")
    assert "".join(first_gemma).replace("▁", " ") == text
    assert gemma.decode(gemma.encode(text), skip_special_tokens=True) == text
    # Its user-defined whitespace tokens are kept whole, as llama.cpp keeps them.
    ids = gemma.encode("a\n\nb\tc", add_special_tokens=False, parse_special=False)
    assert gemma.convert_tokens_to_ids("\n\n") in ids and gemma.convert_tokens_to_ids("\t") in ids


def test_special_tokens_parsed_only_when_asked(variant_dir):
    """``parse_special`` (default on, transformers' ``split_special_tokens`` off): a control
    token typed in text is one id; off, it is text. User-defined tokens stay whole either way."""
    tokenizer = load(variant_path("bpe-qwen2", variant_dir))
    start, think = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<think>"])
    assert tokenizer.encode("<|im_start|>hi", add_special_tokens=False)[0] == start
    assert start not in tokenizer.encode("<|im_start|>hi", parse_special=False)
    assert think in tokenizer.encode("<think>x", parse_special=False)
    tokenizer.split_special_tokens = True
    assert start not in tokenizer.encode("<|im_start|>hi")
    # llama.cpp makes a normal-typed "<|eot_id|>" a control token.
    eot = tokenizer.convert_tokens_to_ids("<|eot_id|>")
    assert tokenizer.encode("a<|eot_id|>", parse_special=True)[-1] == eot


def _bpe_file(tmp_path, **fields) -> str:
    return write_tokenizer_gguf(
        str(tmp_path / "t.gguf"),
        tokens=["a", "b", "ab", "<s>"],
        token_types=[1, 1, 1, 3],
        merges=["a b"],
        bos=3,
        eos=3,
        **fields,
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"model": "gpt2", "pre": "not-a-pre"}, "unknown GGUF tokenizer.ggml.pre 'not-a-pre'"),
        ({"model": "gpt2", "pre": "kimi-k2"}, "tokenizer.ggml.pre 'kimi-k2' is not supported"),
        ({"model": "bert", "pre": "gpt-2"}, "tokenizer.ggml.model 'bert'"),
        ({"model": "rwkv"}, "tokenizer.ggml.model 'rwkv'"),
    ],
)
def test_untokenizable_variant_is_a_value_error_naming_the_field(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        load(_bpe_file(tmp_path, **fields))
