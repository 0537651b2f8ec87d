"""The executable store (jaxgen.engine.executable_store): a stored executable answers as the
jit does, a changed context compiles anew, a torn file is recompiled, and an engine's tokens are
the same with and without the store."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgen.engine import compile_counter, executable_store
from jaxgen.engine.executable_store import StoredJit


@pytest.fixture
def store(tmp_path, monkeypatch):
    """The store in ``tmp_path`` (the compilation cache need not be on)."""
    monkeypatch.setattr(executable_store, "store_directory", lambda: tmp_path)
    compile_counter.install()
    return tmp_path


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
    second_process = _stored()  # a new function object: nothing in memory, the file loads
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
    with pytest.warns(UserWarning, match="unreadable"):
        again = _call(_stored("torn", _cumulative))
    assert all(np.array_equal(a, b) for a, b in zip(again, expected, strict=True))
    assert path.stat().st_size > 100  # replaced by the recompiled executable


def test_closures_and_absent_store_run_the_jit(store, monkeypatch):
    closure = StoredJit(_program, "probe", lambda: f"{(lambda: 0)!r}", static_argnames=("scale",))
    _call(closure)
    monkeypatch.setattr(executable_store, "store_directory", lambda: None)
    _call(_stored())
    assert not list(store.iterdir())


@pytest.mark.slow  # three engines, two of them compiling (~17 s on the 2-core VM)
def test_an_engine_decodes_the_same_tokens_from_stored_steps(store, tiny_model_dir):
    from jaxgen import LLM, SamplingParams
    from jaxgen.engine import step_function
    from jaxgen.loaders import load_model

    loaded = load_model(tiny_model_dir)

    params = SamplingParams(max_tokens=8, temperature=0)
    prompts = [[1, 5, 9, 2], [3, 3, 7]]

    def tokens():
        step_function.jitted_step.cache_clear()  # a new process: nothing in memory
        step_function.jitted_sampler.cache_clear()
        llm = LLM(loaded, max_rolling_batch_size=2, max_model_len=64)
        return [out.outputs[0].token_ids for out in llm.generate(prompts, params)]

    with pytest.MonkeyPatch().context() as patch:
        patch.setattr(executable_store, "store_directory", lambda: None)
        without = tokens()
    compiled = tokens()  # compiles and writes the step's and sampler's executables
    assert any(f.name.startswith("step-") for f in store.iterdir())
    hits = compile_counter.cache_hit_count()
    loaded = tokens()
    assert compile_counter.cache_hit_count() > hits
    assert without == compiled == loaded
