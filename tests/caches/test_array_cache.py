"""The on-disk array cache (jaxgen.caches.array_cache): a hit is a memory-mapped read of what
was saved; a miss, a corrupt file or an unwritable directory is never a failure."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from jaxgen.caches import array_cache
from jaxgen.caches.array_cache import ArrayCache, content_key, file_key

ARRAYS = {
    "codes": np.arange(-60, 60, dtype=np.int8).reshape(8, 15),
    "scales": np.linspace(0, 1, 7, dtype=np.float16),
    "empty": np.zeros((0, 3), np.uint8),
    "scalar": np.array(2.5, np.float32),
}


def assert_same(read: dict, written: dict) -> None:
    assert read.keys() == written.keys()
    for name, array in written.items():
        assert read[name].dtype == array.dtype and read[name].shape == array.shape, name
        np.testing.assert_array_equal(read[name], array)


def test_miss_then_hit_reads_a_memory_map(tmp_path):
    cache = ArrayCache("test", {"model": "a"}, tmp_path)
    assert cache.load() is None
    assert cache.save(ARRAYS)
    read = ArrayCache("test", {"model": "a"}, tmp_path).load()
    assert_same(read, ARRAYS)
    assert not any(array.flags.writeable for array in read.values())  # views of the map
    assert ArrayCache("test", {"model": "b"}, tmp_path).load() is None  # another key


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_corrupt_file_warns_and_misses_then_is_replaced(tmp_path, damage):
    cache = ArrayCache("test", "key", tmp_path)
    cache.save(ARRAYS)
    data = cache.path.read_bytes()
    cache.path.write_bytes(
        {"truncated": data[: len(data) - 40], "garbage": os.urandom(300), "empty": b""}[damage]
    )
    with pytest.warns(UserWarning, match="unreadable"):
        assert cache.load() is None
    assert cache.save(ARRAYS)
    assert_same(cache.load(), ARRAYS)


def test_unwritable_directory_warns_and_runs_without(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cache = ArrayCache("test", "key", blocker / "arrays")  # a directory under a file
    with pytest.warns(UserWarning, match="cannot write"):
        assert not cache.save(ARRAYS)
    assert cache.load() is None


def test_off_by_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(array_cache.ENV_SWITCH, "0")
    cache = ArrayCache("test", "key", tmp_path)
    assert not cache.save(ARRAYS) and cache.load() is None and not list(tmp_path.iterdir())


def test_writers_at_once_leave_one_whole_file(tmp_path):
    caches = [ArrayCache("test", "key", tmp_path) for _ in range(4)]
    threads = [threading.Thread(target=cache.save, args=(ARRAYS,)) for cache in caches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [p.name for p in tmp_path.iterdir()] == [caches[0].path.name]  # no temporary left
    assert_same(caches[0].load(), ARRAYS)


def test_keys(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"1234")
    before = file_key(path)
    assert before["size"] == 4 and before["path"] == os.path.realpath(path)
    os.utime(path, ns=(before["mtime_ns"] + 10**9, before["mtime_ns"] + 10**9))
    assert file_key(path) != before
    a = [np.arange(4, dtype=np.int8)]
    assert content_key(a) == content_key([np.arange(4, dtype=np.int8)])
    assert content_key(a) != content_key([np.arange(4, dtype=np.uint8)])
    assert content_key(a) != content_key([np.arange(1, 5, dtype=np.int8)])
