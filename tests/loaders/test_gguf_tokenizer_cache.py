"""The GGUF tokenizer's cache (``jaxgen.loaders.gguf_tokenizer_cache``): a second load reads
it (not the file), a corrupt entry or an unwritable directory is a warning and a rebuild, small files and the
switch leave it off; the GGUF reader's lazily decoded string arrays."""

from __future__ import annotations

import os

import gguf
import pytest

from jaxgen.loaders.tokenizer import load_tokenizer
from tests.loaders.gguf_tokenizer_files import (
    random_strings,
    special_texts,
)


@pytest.fixture
def tokenizer_cache_dir(tmp_path, monkeypatch):
    """The cache in ``tmp_path``, for files of any size."""
    from jaxgen.caches import array_cache

    monkeypatch.setenv("JAXGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(array_cache, "MIN_BYTES", 0)
    return tmp_path / "cache" / "tokenizers"


def assert_same_plain_tokenizer(ours, built) -> None:
    assert ours.metadata == built.metadata
    assert ours.get_vocab() == built.get_vocab()
    assert ours.special_tokens_map == built.special_tokens_map
    assert (ours.add_bos_token, ours.add_eos_token) == (built.add_bos_token, built.add_eos_token)
    assert ours.chat_template == built.chat_template
    texts = random_strings(200, special_texts(built), seed=3)
    assert [ours.encode(text) for text in texts] == [built.encode(text) for text in texts]


def no_build(monkeypatch):
    from jaxgen.loaders import gguf_tokenizer_cache

    def fail(*args):
        raise AssertionError("the file read, not the cache")

    monkeypatch.setattr(gguf_tokenizer_cache, "GGUFReader", fail)


@pytest.mark.parametrize("kind", ["byte_level_gguf", "sentencepiece_gguf"])
def test_second_load_reads_the_cached_tokenizer(kind, request, tokenizer_cache_dir, monkeypatch):
    path = request.getfixturevalue(kind)
    built = load_tokenizer(path)
    assert len(list(tokenizer_cache_dir.glob("gguf-*.json"))) == 1
    with monkeypatch.context() as patch:
        no_build(patch)
        assert_same_plain_tokenizer(load_tokenizer(path), built)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "other key"])
def test_corrupt_tokenizer_entry_warns_and_is_rebuilt(byte_level_gguf, tokenizer_cache_dir, damage):
    built = load_tokenizer(byte_level_gguf)
    (entry,) = tokenizer_cache_dir.glob("gguf-*.json")
    data = entry.read_bytes()
    body = data.split(b"\n", 1)[1]
    entry.write_bytes(
        {
            "truncated": data[: len(data) // 2],
            "garbage": os.urandom(300),
            "empty": b"",
            "other key": b'{"description": "another file", "options": {}}\n' + body,
        }[damage]
    )
    with pytest.warns(UserWarning, match="unreadable"):
        assert_same_plain_tokenizer(load_tokenizer(byte_level_gguf), built)
    assert entry.read_bytes() == data  # rewritten whole


def test_unwritable_tokenizer_cache_warns_and_loads(byte_level_gguf, tmp_path, monkeypatch):
    from jaxgen.caches import array_cache

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("JAXGEN_CACHE_DIR", str(blocker / "cache"))  # a directory under a file
    monkeypatch.setattr(array_cache, "MIN_BYTES", 0)
    with pytest.warns(UserWarning, match="cannot write"):
        tokenizer = load_tokenizer(byte_level_gguf)
    assert tokenizer.encode("hello <|im_start|>", add_special_tokens=False)


def test_tokenizer_cache_off_and_small_files(byte_level_gguf, tmp_path, monkeypatch):
    from jaxgen.caches import array_cache

    monkeypatch.setenv("JAXGEN_CACHE_DIR", str(tmp_path / "cache"))
    load_tokenizer(byte_level_gguf)  # under array_cache.MIN_BYTES: not cached
    monkeypatch.setattr(array_cache, "MIN_BYTES", 0)
    monkeypatch.setenv(array_cache.ENV_SWITCH, "0")
    load_tokenizer(byte_level_gguf)
    assert not (tmp_path / "cache").exists()


def test_reader_string_arrays_match_gguf(byte_level_gguf, tmp_path):
    """String arrays (decoded when read) hold what the ``gguf`` package reads; a file cut inside
    one is refused when opened."""
    from jaxgen.loaders.gguf_reader import GGUFReader

    ours = GGUFReader(byte_level_gguf).fields
    reference = gguf.GGUFReader(byte_level_gguf)
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        assert ours[key] == list(reference.fields[key].contents())
    assert dict(ours)["tokenizer.ggml.model"] == "gpt2"
    data = open(byte_level_gguf, "rb").read()
    cut = data.index(b"tokenizer.ggml.merges") + 200  # inside the merges
    (tmp_path / "cut.gguf").write_bytes(data[:cut])
    with pytest.raises(ValueError, match="truncated"):
        GGUFReader(tmp_path / "cut.gguf")
