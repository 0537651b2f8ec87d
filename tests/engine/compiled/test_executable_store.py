"""The executable store (jaxgen.engine.compiled.executable_store): a stored executable answers as the
jit does, a changed context compiles anew, a torn file is recompiled, and an engine's tokens are
the same with and without the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgen.engine.compiled import compile_counter, executable_store
from jaxgen.engine.compiled.executable_store import StoredJit


@pytest.fixture
def store(fresh_executables):
    """The store in a directory of its own (the compilation cache need not be on), with this
    process's executables forgotten for the test (as if it were a new process)."""
    compile_counter.install()
    return fresh_executables


def _program(x, pool, *, scale=None):
    """A sort (a kernel XLA's CPU names as every executable does), an iota and a donated pool;
    ``scale`` is static."""
    ordered = jnp.sort(x * scale)  # [N]
    return ordered + jnp.arange(x.shape[0]), pool + ordered.sum()


def _cumulative(x, pool, *, scale=None):
    """As ``_program`` with a cumulative sum: XLA's CPU compiles a sort comparator once per
    process and cannot serialize the executables that reuse it, so each test's program that
    is written to the store is its own."""
    summed = jnp.cumsum(x * scale)  # [N]
    return summed + jnp.arange(x.shape[0]), pool + summed.sum()


def _stored(context: str = "v1", program=_program) -> StoredJit:
    return StoredJit(
        program, "probe", lambda: context, static_argnames=("scale",), donate_argnums=(1,)
    )


def _call(function, n: int = 6, scale: int = 3):
    x = np.linspace(1.0, -1.0, n, dtype=np.float32)
    return [np.asarray(a) for a in function(x, jnp.zeros(4), scale=scale)]


def test_a_stored_executable_answers_as_the_jit(store):
    expected = _call(jax.jit(_program, static_argnames=("scale",)))
    first = _call(_stored())
    files = sorted(store.iterdir())
    assert [f.name.startswith("probe-") for f in files] == [True]
    hits = compile_counter.cache_hit_count()
    executable_store._PROCESS_EXECUTABLES.clear()  # as a new process: nothing in memory
    second_process = _stored()  # the file loads
    for _ in range(2):
        assert all(
            np.array_equal(a, b) for a, b in zip(_call(second_process), expected, strict=True)
        )
    assert compile_counter.cache_hit_count() == hits + 1
    assert all(np.array_equal(a, b) for a, b in zip(first, expected, strict=True))
    # Another shape, another static value: other files; the first is left as it was.
    _call(second_process, n=8)
    _call(second_process, scale=5)
    assert len(list(store.iterdir())) == 3 and files[0].exists()


def test_a_changed_context_compiles_anew(store):
    _call(_stored("v1", _cumulative))
    hits = compile_counter.cache_hit_count()
    _call(_stored("v2", _cumulative))  # e.g. another model graph or source: never the old file
    assert compile_counter.cache_hit_count() == hits
    assert len(list(store.iterdir())) == 2


def test_a_torn_file_is_recompiled(store):
    expected = _call(_stored("torn", _cumulative))
    (path,) = store.iterdir()
    path.write_bytes(path.read_bytes()[:100])
    jax.clear_caches()  # as a new process: jax's in-memory executables gone too
    executable_store._PROCESS_EXECUTABLES.clear()
    with pytest.warns(UserWarning, match="unreadable"):
        again = _call(_stored("torn", _cumulative))
    assert all(np.array_equal(a, b) for a, b in zip(again, expected, strict=True))
    assert path.stat().st_size > 100  # replaced by the recompiled executable


def _cumulative_product(x, pool, *, scale=None):
    """As ``_cumulative`` with a cumulative product (this file's prefetch tests' own program)."""
    product = jnp.cumprod(x * scale)  # [N]
    return product + jnp.arange(x.shape[0]), pool + product.sum()


def _as_a_new_process() -> None:
    jax.clear_caches()
    executable_store._PROCESS_EXECUTABLES.clear()


def test_prefetch_reads_what_the_last_run_of_the_job_used(store):
    assert executable_store.prefetch("job") is None  # no run of it recorded yet
    expected = _call(_stored("prefetch", _cumulative_product))
    (executable,) = store.glob("probe-*.bin")
    (listing,) = store.glob("job-*.txt")
    assert listing.read_text().split() == [executable.name]
    written = listing.stat().st_mtime_ns

    _as_a_new_process()
    hooks = []
    thread = executable_store.prefetch("job", before=lambda: hooks.append("registered"))
    thread.join()
    assert hooks == ["registered"]
    prefetched = executable_store._PENDING[executable.name].result()  # read on the thread
    assert prefetched is not None
    again = _call(_stored("prefetch", _cumulative_product))
    assert all(np.array_equal(a, b) for a, b in zip(again, expected, strict=True))
    assert executable_store._PROCESS_EXECUTABLES[executable.name] is prefetched  # not read again
    assert not executable_store._PENDING
    assert listing.stat().st_mtime_ns == written  # the same executables: the list is kept

    _as_a_new_process()  # another job's list is another file; this one's reads nothing new
    assert executable_store.prefetch("another job") is None
    assert len(list(store.glob("job-*.txt"))) == 1


def test_a_prefetch_that_fails_reads_again_where_needed(store):
    executable_store.prefetch("job")  # the job's first run: its list is recorded
    expected = _call(_stored("prefetch-torn", _cumulative_product))
    (executable,) = store.glob("probe-*.bin")
    executable.write_bytes(b"torn")
    _as_a_new_process()

    def failing_hook():
        raise RuntimeError("kernels unavailable")

    executable_store.prefetch("job", before=failing_hook).join()  # no error on the thread
    assert executable_store._PENDING[executable.name].result() is None
    with pytest.warns(UserWarning, match="unreadable"):
        again = _call(_stored("prefetch-torn", _cumulative_product))
    assert all(np.array_equal(a, b) for a, b in zip(again, expected, strict=True))


def test_closures_and_absent_store_run_the_jit(store, monkeypatch):
    closure = StoredJit(_program, "probe", lambda: f"{(lambda: 0)!r}", static_argnames=("scale",))
    _call(closure)
    monkeypatch.setattr(executable_store, "store_directory", lambda: None)
    _call(_stored())
    assert not list(store.iterdir())


_ENGINE_SCRIPT = """
import json, sys
from jaxgen import LLM, SamplingParams
from jaxgen.engine.compiled import compile_counter
compile_counter.install()
llm = LLM(sys.argv[1], max_rolling_batch_size=2, max_model_len=64)
outputs = llm.generate([[1, 5, 9, 2], [3, 3, 7]], SamplingParams(max_tokens=8, temperature=0))
tokens = [out.outputs[0].token_ids for out in outputs]
print(json.dumps([tokens, compile_counter.cache_hit_count()]))
"""


def _engine_in_a_new_process(model_dir: str, store_root, xla_cache) -> tuple[list, int]:
    """(an engine's greedy tokens, the compilations a cache answered) in a fresh Python whose
    executable store is under ``store_root`` and jax's persistent cache in ``xla_cache``
    (which stores every compile, however quick)."""
    env = dict(
        os.environ,
        JAXGEN_CACHE_DIR=str(store_root),
        JAXGEN_COMPILE_CACHE="1",
        JAX_COMPILATION_CACHE_DIR=str(xla_cache),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    )
    done = subprocess.run(
        [sys.executable, "-c", _ENGINE_SCRIPT, model_dir],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    tokens, hits = json.loads(done.stdout.strip().splitlines()[-1])
    return tokens, hits


@pytest.mark.slow  # four engines, three in processes of their own (~60 s on the 2-core VM)
def test_an_engine_decodes_the_same_tokens_from_stored_steps(tmp_path, tiny_model_dir):
    """A process that compiles writes the step's and sampler's executables; another, with an
    empty store but the same persistent cache, compiles them again (that cache never holds
    the store's programs: one it answered would be written without its kernels); a third
    loads what the second wrote, and every engine decodes the tokens of one without the
    store."""
    from jaxgen import LLM, SamplingParams

    with pytest.MonkeyPatch().context() as patch:
        patch.setattr(executable_store, "store_directory", lambda: None)
        llm = LLM(tiny_model_dir, max_rolling_batch_size=2, max_model_len=64)
        params = SamplingParams(max_tokens=8, temperature=0)
        outputs = llm.generate([[1, 5, 9, 2], [3, 3, 7]], params)
        without = [out.outputs[0].token_ids for out in outputs]
    xla = tmp_path / "xla"
    first, _ = _engine_in_a_new_process(tiny_model_dir, tmp_path / "first", xla)
    second, _ = _engine_in_a_new_process(tiny_model_dir, tmp_path / "second", xla)
    stored = sorted(f.name.split("-")[0] for f in (tmp_path / "second/executables").iterdir())
    assert "step" in stored and "sampler" in stored
    loaded, hits = _engine_in_a_new_process(tiny_model_dir, tmp_path / "second", xla)
    assert hits >= len(stored)
    assert without == first == second == loaded


def test_an_executable_the_persistent_cache_answered_is_not_written(store, monkeypatch):
    """XLA:CPU writes a deserialized executable again without its kernels: a compile that
    jax's persistent cache answered runs, but stays out of the store."""
    monkeypatch.setattr(executable_store._PersistentCacheHits, "so_far", iter(range(10)).__next__)
    expected = _call(jax.jit(_cumulative, static_argnames=("scale",)), n=7)
    answered = _call(_stored("answered", _cumulative), n=7)
    assert all(np.array_equal(a, b) for a, b in zip(answered, expected, strict=True))
    assert not list(store.iterdir())


def test_one_executable_per_signature_in_a_process(store):
    """Two ``StoredJit`` of one function and context (two engines over one model) share the
    executable the first compiled: neither compiled nor loaded again in the process."""
    first = _stored("shared", _cumulative)
    expected = _call(first)
    compiles, hits = compile_counter.compile_count(), compile_counter.cache_hit_count()
    second = _stored("shared", _cumulative)
    assert all(np.array_equal(a, b) for a, b in zip(_call(second), expected, strict=True))
    assert (compile_counter.compile_count(), compile_counter.cache_hit_count()) == (compiles, hits)
    x = np.linspace(1.0, -1.0, 6, dtype=np.float32)
    assert second.stored(x, jnp.zeros(4), scale=3) is first.stored(x, jnp.zeros(4), scale=3)
