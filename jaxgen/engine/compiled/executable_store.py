"""Compiled executables kept on disk, so a second run neither traces, lowers nor compiles.

JAX's persistent compilation cache (``jaxgen.caches.compile_cache``) saves XLA's compile only: every
run still traces and lowers the engine's step to look its executable up, which costs seconds
for a model's step on a CPU. ``StoredJit`` wraps a jitted function: the first call of a
signature (static arguments, argument structure, shapes and dtypes) looks for its serialized
executable in ``$JAXGEN_CACHE_DIR/executables``; if absent it compiles (``lower().compile()``)
and writes it there. A file's name hashes the signature with everything else that determines
the program: the function's own context (the model graph, the backend), the jaxgen sources,
the jax and jaxlib versions, the devices, jax's numeric settings and the ``JAX*`` / ``XLA*`` /
``JAXGEN*`` environment; a change in any of them is a new file, never a stale one.

On only where the compilation cache is (``enable_compile_cache``), on one CPU device (the
start-up this exists for; XLA:CPU's serialization is the one checked here, accelerators keep
the compilation cache alone); an entry that cannot be read is compiled again, a directory that cannot be written runs without it.
A loaded executable counts as a compilation answered by the cache (``compile_counter``).

Reading an executable costs XLA:CPU ~0.2 s for a model's step (linking its code), most of it
outside the GIL. ``prefetch(job)`` reads, on a thread, the files the last run of the same job
(a text naming the model and the engine's configuration) used, in the order it used them,
while the model loads; each run records its own list (``job-<key>.txt``) for the next.

A process holds one executable per file name (``_PROCESS_EXECUTABLES``), shared by every
``StoredJit`` and kept for the life of the process: XLA:CPU reuses kernels a process has
already compiled under the same names, so a second compile of one signature in one process
can write a file that lacks them ("Function ... not found" where another process loads it).
"""

from __future__ import annotations

import functools
import hashlib
import pickle
import re
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import jax
import numpy as np

from jaxgen.caches.atomic_file import atomic_write
from jaxgen.engine.compiled import compile_counter
from jaxgen.engine.compiled.executable_context import process_context

_UNIQUE_KERNEL_NAMES = {"xla_cpu_generate_unique_c_style_kernel_entry_points": True}


class StoredJit:
    """``jax.jit(fun, **jit_options)`` with its executables kept on disk. ``context``:
    returns a text naming what the traced program depends on besides its arguments (for the
    step: the model graph and the backend; called once, at the first compile). Functions in it
    are named without their addresses; a lambda or a local function (a closure, which its name
    does not determine) turns the store off for this function. Attributes other than the call
    (``lower``, ``trace``...) are the jitted function's."""

    def __init__(self, fun, name: str, context: Callable[[], str], **jit_options):
        self._fun = fun
        self._jit_options = jit_options
        self._jitted = jax.jit(fun, **jit_options)
        self._name = name
        self._context = context
        self._static = frozenset(jit_options.get("static_argnames", ()))
        # signature -> jax.stages.Compiled (or None: the jit runs it); emptied by
        # ``jax.clear_caches()`` as the jit's own executables are.
        self._compiled = _Executables()
        # position -> (the list last passed there, its signature): a list argument passed
        # again (the same object) is not walked again; its arrays are checked by the call.
        self._list_signatures: dict[int, tuple] = {}

    def __getattr__(self, attribute):
        return getattr(self._jitted, attribute)

    def forget_arguments(self) -> None:
        """Drops the lists the last calls passed (kept so as not to walk them again), so that
        their arrays can be freed: an engine's weights, when it sleeps or takes new ones."""
        self._list_signatures.clear()

    def stored(self, *args, **kwargs):
        """The executable a call with these arguments runs from the store (a
        ``jax.stages.Compiled``: its ``memory_analysis`` is the step's own), or None when that
        call runs through the jit."""
        if self._context is False:
            return None
        signature, _ = self._signature(args, kwargs)
        return self._compiled.get(signature) if signature is not None else None

    def _signature(self, args, kwargs):
        """``(the call's signature, or None where a leaf is no array; its dynamic kwargs)``."""
        statics = tuple(sorted((k, v) for k, v in kwargs.items() if k in self._static))
        dynamic = {k: v for k, v in kwargs.items() if k not in self._static}
        parts = [statics, _signature(dynamic)]
        for position, arg in enumerate(args):
            memo = self._list_signatures.get(position)
            if memo is not None and memo[0] is arg:  # the same list as the last call's
                parts.append(memo[1])
                continue
            part = _signature(arg)
            if isinstance(arg, list):  # e.g. the step's parameters: hundreds of arrays
                self._list_signatures[position] = (arg, part)
            parts.append(part)
        if any(part is None for part in parts[1:]):  # a leaf that is no array: the jit's path
            return None, dynamic
        return tuple(parts), dynamic

    def __call__(self, *args, **kwargs):
        if self._context is False:
            return self._jitted(*args, **kwargs)
        signature, dynamic = self._signature(args, kwargs)
        if signature is None:
            return self._jitted(*args, **kwargs)
        compiled = self._compiled.get(signature, False)
        if compiled is False:
            compiled = self._compiled[signature] = self._load_or_compile(signature, args, kwargs)
        if compiled is None:
            return self._jitted(*args, **kwargs)
        return compiled(*args, **dynamic)

    def _load_or_compile(self, signature, args, kwargs):
        """The signature's executable: read from the store, else compiled and written there;
        None when the store is off (then the jit runs as usual)."""
        directory = store_directory()
        single_cpu = jax.device_count() == 1 and jax.default_backend() == "cpu"
        if directory is None or not single_cpu or not self._stable_context():
            return None
        text = "\n".join((process_context(), self._name, self._context, _stable(signature)))
        if "<lambda>" in text or "<locals>" in text:
            return None
        key = hashlib.sha256(text.encode()).hexdigest()
        path = directory / f"{self._name}-{key[:40]}.bin"
        _record_use(directory, path.name)
        compiled = _PROCESS_EXECUTABLES.get(path.name)
        if compiled is not None:  # compiled or loaded before in this process
            return compiled
        prefetched = _PENDING.pop(path.name, None)
        compiled = prefetched.result() if prefetched is not None else None
        if compiled is None:
            compiled = _read(path)
        if compiled is not None:
            compile_counter.record_loaded()
            _PROCESS_EXECUTABLES[path.name] = compiled
            return compiled
        # Compiled here, with kernel names unique to the executable (its module is named by
        # its key). jax's persistent cache is kept out of it: an executable that cache answers
        # is one it deserialized, and XLA:CPU writes such an executable again without its
        # kernels ("Function ..._wrapped_iota not found" where another process loads the
        # file). The store's compiles are never put into that cache, and one it answered
        # anyway (an entry from before) runs here but is not written.
        jitted = jax.jit(_renamed(self._fun, f"{self._name}_{key[:16]}"), **self._jit_options)
        hits = _PersistentCacheHits.so_far()
        with _kept_out_of_the_persistent_cache():
            compiled = jitted.lower(*args, **kwargs).compile(compiler_options=_UNIQUE_KERNEL_NAMES)
        _PROCESS_EXECUTABLES[path.name] = compiled
        if _PersistentCacheHits.so_far() == hits:
            _write(path, compiled)
        return compiled

    def _stable_context(self) -> bool:
        """Evaluates the context once; False (store off) if it names a closure."""
        if callable(self._context):
            context = _stable(self._context())
            closure = "<lambda>" in context or "<locals>" in context
            self._context = False if closure else context
        return self._context is not False


# file name -> the process's one executable of it (see the module docstring); never emptied.
_PROCESS_EXECUTABLES: dict[str, jax.stages.Compiled] = {}
# file name -> its read on the prefetch thread (the executable, or None where that failed).
_PENDING: dict[str, Future] = {}
# The job ``prefetch`` last started: (its list's path, the list read, the files used since).
_JOB: tuple[Path, list[str], list[str]] | None = None


def prefetch(job: str, before: Callable[[], object] | None = None) -> threading.Thread | None:
    """Starts reading the executables the last run of ``job`` used (see the module docstring)
    on a thread, and records this run's from here on. ``before``: called on the thread first
    (e.g. registering the native kernels the executables call). Returns the thread, or None
    where the store is off or there is nothing to read. A file the thread cannot read is read
    again where it is needed, as without prefetching."""
    global _JOB
    directory = store_directory()
    if directory is None or jax.device_count() != 1 or jax.default_backend() != "cpu":
        return None
    key = hashlib.sha256(f"{process_context()}\n{_stable(job)}".encode()).hexdigest()
    listing = directory / f"job-{key[:40]}.txt"
    try:
        previous = listing.read_text().split()
    except OSError:
        previous = []
    _JOB = (listing, previous, [])
    names = [n for n in previous if n not in _PROCESS_EXECUTABLES and n not in _PENDING]
    if not names:
        return None
    futures = [_PENDING.setdefault(name, Future()) for name in names]

    def read_all():
        try:
            if before is not None:
                before()
        except Exception:  # the reads below fail too, and are done again where needed
            pass
        for name, future in zip(names, futures, strict=True):
            try:
                future.set_result(_deserialize((directory / name).read_bytes()))
            except Exception:
                future.set_result(None)

    thread = threading.Thread(target=read_all, name="jaxgen-executable-prefetch", daemon=True)
    thread.start()
    return thread


def _record_use(directory: Path, name: str) -> None:
    """Adds file ``name`` (of ``directory``) to the current job's list: the executables this
    process uses from the job's start (with a draft model, the target's and the draft's). The
    list is written when it is no longer the one read (a run that uses the last run's
    executables in the same order writes nothing)."""
    if _JOB is None:
        return
    listing, previous, used = _JOB
    if name in used or listing.parent != directory:
        return
    used.append(name)
    if used != previous[: len(used)]:
        try:
            with atomic_write(listing) as handle:
                handle.write("\n".join(used).encode())
        except OSError:  # the store warns about its directory where it writes executables
            pass


class _Executables(dict):
    """A ``StoredJit``'s executables in memory, registered with jax's cache management."""

    def __init__(self):
        super().__init__()
        try:
            from jax._src import util

            util.register_cache(self, "jaxgen executable store")
        except (ImportError, AttributeError):  # another jax: cleared only with the process
            pass

    __hash__ = object.__hash__  # a weak key of jax's registry

    def cache_clear(self) -> None:
        self.clear()

    def cache_info(self) -> str:
        return f"{len(self)} executables"

    def cache_keys(self) -> list:
        return list(self)


def _stable(value) -> str:
    """``repr(value)`` without object addresses (which differ from process to process)."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def _renamed(fun, name: str):
    """``fun`` under another name (the name of the module jax lowers it to)."""

    @functools.wraps(fun)
    def renamed(*args, **kwargs):
        return fun(*args, **kwargs)

    renamed.__name__ = renamed.__qualname__ = name
    return renamed


def _kept_out_of_the_persistent_cache():
    """A context where jax's persistent compilation cache stores nothing (its minimum compile
    time is infinite; read where it stores, unlike its on/off switch, which jax reads once)."""
    from jax._src import config as jax_config

    return jax_config.persistent_cache_min_compile_time_secs(float("inf"))


class _PersistentCacheHits:
    """Counts jax's persistent compilation cache hits in this process, from the first call."""

    count = 0
    listening = False

    @classmethod
    def so_far(cls) -> int:
        if not cls.listening:
            cls.listening = True
            jax.monitoring.register_event_listener(cls._record)
        return cls.count

    @classmethod
    def _record(cls, event: str, **kwargs) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            cls.count += 1


def _signature(tree) -> tuple | None:
    """``tree``'s structure and each leaf's (shape, dtype, weak type); None if a leaf is not an
    array."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    avals = []
    for leaf in leaves:
        if isinstance(leaf, jax.Array):
            avals.append((leaf.shape, leaf.dtype, leaf.weak_type))
        elif isinstance(leaf, np.ndarray):
            avals.append((leaf.shape, leaf.dtype, False))
        else:
            return None
    return treedef, tuple(avals)


def store_directory() -> Path | None:
    """``$JAXGEN_CACHE_DIR/executables`` when the compilation cache is on, else None."""
    if not jax.config.jax_compilation_cache_dir:
        return None
    from jaxgen.caches.compile_cache import cache_root

    return cache_root() / "executables"


def _read(path: Path):
    """The executable stored at ``path``, or None (absent, or unreadable: then compiled)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        return _deserialize(data)
    except Exception as error:  # a torn or foreign file: compile again, and replace it
        warnings.warn(
            f"executable store: {path.name} unreadable ({error!r}); recompiling", stacklevel=3
        )
        return None


def _deserialize(data: bytes):
    from jax.experimental import serialize_executable

    serialized, in_tree, out_tree = pickle.loads(data)
    return serialize_executable.deserialize_and_load(serialized, in_tree, out_tree)


def _write(path: Path, compiled) -> None:
    """Stores ``compiled`` at ``path`` atomically (a reader sees all of it or nothing); an
    executable that cannot be serialized, or a directory that cannot be written, is skipped."""
    from jax.experimental import serialize_executable

    try:
        data = pickle.dumps(serialize_executable.serialize(compiled))
    except Exception:  # e.g. a backend without serialization: nothing to store
        return
    try:
        with atomic_write(path) as handle:
            handle.write(data)
    except OSError as error:
        warnings.warn(
            f"executable store: cannot write {path} ({error.strerror or error})", stacklevel=3
        )
