"""The persistent compilation cache (jaxgen.caches.compile_cache): on by default, off on request,
and a bad cache directory never fails a run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from jaxgen.caches import compile_cache

ROOT = Path(__file__).resolve().parents[2]
# A process that turns the cache on and compiles one function.
PROBE = (
    "import jax, jax.numpy as jnp\n"
    "from jaxgen.caches.compile_cache import enable_compile_cache\n"
    "print(enable_compile_cache())\n"
    "print(int(jax.jit(lambda x: x * 3 + 1)(jnp.int32(4))))\n"
)


@pytest.fixture
def no_cache_dir():
    """This process's cache directory unset for the test (restored after)."""
    previous = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    yield
    jax.config.update("jax_compilation_cache_dir", previous)


def _probe(cache_root: Path, **env) -> subprocess.Popen:
    environment = dict(
        os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), JAXGEN_CACHE_DIR=str(cache_root)
    )
    environment.pop(compile_cache.ENV_SWITCH, None)
    return subprocess.Popen(
        [sys.executable, "-c", PROBE],
        env={**environment, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen) -> tuple[list[str], str]:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-3000:]
    return out.split(), err


def test_an_unwritable_cache_dir_warns_and_runs_without(tmp_path, monkeypatch, no_cache_dir):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("JAXGEN_CACHE_DIR", str(blocker))
    monkeypatch.delenv(compile_cache.ENV_SWITCH, raising=False)
    with pytest.warns(UserWarning, match="compilation cache off"):
        assert compile_cache.enable_compile_cache() is None
    assert jax.config.jax_compilation_cache_dir is None


def test_the_cache_is_off_on_request(tmp_path, monkeypatch, no_cache_dir):
    monkeypatch.setenv("JAXGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(compile_cache.ENV_SWITCH, "0")
    assert compile_cache.enable_compile_cache() is None
    monkeypatch.delenv(compile_cache.ENV_SWITCH)
    assert compile_cache.enable_compile_cache(False) is None
    assert jax.config.jax_compilation_cache_dir is None and not (tmp_path / "xla").exists()


def test_processes_share_the_cache_and_a_corrupt_entry_is_recompiled(tmp_path):
    # Two processes at once on an empty cache: both answer, and the entry is written.
    first, second = _probe(tmp_path), _probe(tmp_path)
    for process in (first, second):
        lines, _ = _finish(process)
        assert lines == [str(tmp_path / "xla"), "13"]
    entries = [path for path in (tmp_path / "xla").iterdir() if path.is_file()]
    assert entries
    # Every entry truncated: a warning, a recompile, the same answer.
    for entry in entries:
        entry.write_bytes(entry.read_bytes()[:7])
    lines, err = _finish(_probe(tmp_path))
    assert lines[-1] == "13"
    assert "persistent compilation cache" in err
