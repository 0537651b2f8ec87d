"""A GGUF's converted quantised tensors kept on disk (jaxgen.loaders.gguf_weights_cache) and the
CPU backend's packed panels (pack_shared): a second read converts nothing and gives the same
arrays; a changed file or a corrupt entry converts again."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from jaxgen.backends.cpu_kernels import shared_panels
from jaxgen.caches import array_cache
from jaxgen.loaders import gguf_loader
from jaxgen.loaders.gguf_loader import GGUFFile

NAMES = {  # HF name -> (GGUF name, type)
    "model.layers.0.mlp.up_proj.weight": ("blk.0.ffn_up.weight", "Q8_0"),
    "model.layers.0.mlp.down_proj.weight": ("blk.0.ffn_down.weight", "Q4_1"),
    "model.layers.0.mlp.gate_proj.weight": ("blk.0.ffn_gate.weight", "Q4_0"),
    "model.layers.0.self_attn.o_proj.weight": ("blk.0.attn_output.weight", "Q5_1"),  # planes
}


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """The cache in ``tmp_path``, for files of any size."""
    monkeypatch.setenv("JAXGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(array_cache, "MIN_BYTES", 0)
    return tmp_path / "cache" / "arrays"


def write_quantized_gguf(path: str, seed: int = 0) -> str:
    import gguf

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    rng = np.random.default_rng(seed)
    for gguf_name, qtype in NAMES.values():
        data = rng.standard_normal((48, 64)).astype(np.float32)
        kind = gguf.GGMLQuantizationType[qtype]
        writer.add_tensor(gguf_name, gguf.quants.quantize(data, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def read_all(path: str) -> dict:
    gguf_file = GGUFFile(path)
    weights = {name: gguf_file.get_quantized(name) for name in NAMES}
    gguf_file.save_cache()
    return weights


def assert_same(a, b) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


def no_conversion(monkeypatch):
    def fail(*args):
        raise AssertionError("converted, not read from the cache")

    monkeypatch.setattr(gguf_loader.GGUFFile, "_convert_quantized", fail)


def test_second_read_converts_nothing(tmp_path, cache_dir, monkeypatch):
    path = write_quantized_gguf(str(tmp_path / "model.gguf"))
    first = read_all(path)
    assert len(list(cache_dir.glob("gguf-*.bin"))) == 1
    with monkeypatch.context() as patch:
        no_conversion(patch)
        assert_same(read_all(path), first)
    monkeypatch.setenv(array_cache.ENV_SWITCH, "0")  # off: converted again, the same
    assert_same(read_all(path), first)


def test_changed_file_is_a_miss(tmp_path, cache_dir):
    path = write_quantized_gguf(str(tmp_path / "model.gguf"))
    read_all(path)
    write_quantized_gguf(path, seed=1)  # same size, new contents and time
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert_same(read_all(path), read_all_uncached(path))


def read_all_uncached(path: str) -> dict:
    gguf_file = GGUFFile(path)
    return {name: gguf_file._convert_quantized(name, gguf_file.tensor_type(name)) for name in NAMES}


def test_corrupt_entry_warns_and_converts(tmp_path, cache_dir):
    path = write_quantized_gguf(str(tmp_path / "model.gguf"))
    first = read_all(path)
    (entry,) = cache_dir.glob("gguf-*.bin")
    entry.write_bytes(entry.read_bytes()[:200])
    with pytest.warns(UserWarning, match="unreadable"):
        assert_same(read_all(path), first)
    assert_same(read_all(path), first)  # rewritten whole


def test_unwritable_cache_warns_and_loads(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("JAXGEN_CACHE_DIR", str(blocker))
    monkeypatch.setattr(array_cache, "MIN_BYTES", 0)
    path = write_quantized_gguf(str(tmp_path / "model.gguf"))
    with pytest.warns(UserWarning, match="cannot write"):
        weights = read_all(path)
    assert_same(weights, read_all_uncached(path))


def test_packed_panels_read_back(tmp_path, cache_dir, monkeypatch):
    path = write_quantized_gguf(str(tmp_path / "model.gguf"))
    weights = [jax.device_put(w) for w in read_all_uncached(path).values()]
    packed = shared_panels.pack_shared(weights)
    assert len(list(cache_dir.glob("cpu-packed-*.bin"))) == 1

    def fail(*args):
        raise AssertionError("packed, not read from the cache")

    monkeypatch.setattr(shared_panels, "_pack_host_buffers", fail)
    assert_same(shared_panels.pack_shared(weights), packed)
    changed = [weights[1], weights[0], weights[2]]  # other contents in each place: a miss
    monkeypatch.undo()
    monkeypatch.setenv("JAXGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(array_cache, "MIN_BYTES", 0)
    assert len(shared_panels.pack_shared(changed)) == 3
    assert len(list(cache_dir.glob("cpu-packed-*.bin"))) == 2
