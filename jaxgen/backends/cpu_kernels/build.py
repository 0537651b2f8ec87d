"""Builds the native XLA:CPU kernels under ``native/`` on first use and loads them (the engine
factory starts it on a thread before the model loads: ``build_in_background``).

Every ``native/*.cc`` is compiled with the machine's C++ compiler (one process per file, at
once) and linked into one shared library (so the kernels share one worker pool,
``native/parallel_for.h``), cached under ``$JAXGEN_CACHE_DIR`` (default ``~/.cache/jaxgen``) and
keyed by the sources, the flags and jaxlib.
``JAXGEN_DISABLE_CPU_KERNELS=1``, a missing compiler or a failed build make ``load_library``
return None, and callers keep their pure-JAX path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import jax

from jaxgen.config.compile_cache import cache_root

SOURCE_DIR = Path(__file__).parent / "native"
# Reassociation lets the compiler vectorise reductions; nothing else is relaxed.
CXX_FLAGS = (
    "-O3",
    "-march=native",
    "-std=c++17",
    "-shared",
    "-fPIC",
    "-pthread",
    "-fno-math-errno",
    "-fassociative-math",
    "-fno-signed-zeros",
    "-fno-trapping-math",
)


def _cache_dir() -> Path:
    return cache_root() / "kernels"


def _build(compiler: str) -> Path:
    """Compiles every ``native/*.cc`` into the cache unless an identical build is there."""
    import jaxlib

    sources = sorted(SOURCE_DIR.glob("*.cc"))
    digest = hashlib.sha256()
    for path in [*sources, *sorted(SOURCE_DIR.glob("*.h"))]:
        digest.update(path.name.encode() + path.read_bytes())
    digest.update(" ".join(CXX_FLAGS).encode() + jaxlib.__version__.encode())
    library = _cache_dir() / f"jaxgen_cpu_kernels-{digest.hexdigest()[:16]}.so"
    if library.exists():
        return library
    library.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library.parent) as tmp:
        partial = Path(tmp) / library.name
        include = [f"-I{jax.ffi.include_dir()}", f"-I{SOURCE_DIR}"]
        objects = [Path(tmp) / f"{source.stem}.o" for source in sources]
        _compile_at_once(
            [
                [compiler, *CXX_FLAGS, *include, "-c", str(source), "-o", str(obj)]
                for source, obj in zip(sources, objects, strict=True)
            ]
        )
        command = [compiler, *CXX_FLAGS, *map(str, objects), "-o", str(partial)]
        subprocess.run(command, check=True, capture_output=True, text=True)
        os.replace(partial, library)  # atomic: concurrent builders never see half a file
    return library


def _compile_at_once(commands: list[list[str]]) -> None:
    """Runs the compiler commands (one per translation unit) concurrently: on an empty cache
    the build is most of a first run's wall time, and one process per unit uses every core.
    Raises ``CalledProcessError`` for the first that fails (after all have finished)."""
    processes = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for command in commands
    ]
    failures = []
    for process in processes:
        out, err = process.communicate()
        if process.returncode != 0:
            failures.append(
                subprocess.CalledProcessError(process.returncode, process.args, out, err)
            )
    if failures:
        raise failures[0]


_build_lock = threading.Lock()


def load_library() -> ctypes.CDLL | None:
    """The built kernels library, or None (with a warning if a build failed). Thread-safe: a
    caller waits for a build already under way (``build_in_background``)."""
    with _build_lock:
        return _load_library()


def build_in_background() -> threading.Thread | None:
    """Starts building (or loading) the library on a thread, so an empty cache's compile
    overlaps the model's load; None when the kernels are off or the default device is no CPU."""
    if os.environ.get("JAXGEN_DISABLE_CPU_KERNELS") or jax.default_backend() != "cpu":
        return None
    thread = threading.Thread(target=load_library, name="jaxgen-cpu-kernels", daemon=True)
    thread.start()
    return thread


@functools.cache
def _load_library() -> ctypes.CDLL | None:
    if os.environ.get("JAXGEN_DISABLE_CPU_KERNELS"):
        return None
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        return None
    try:
        return ctypes.cdll.LoadLibrary(str(_build(compiler)))
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or error
        warnings.warn(f"native CPU kernels unavailable: {detail}", stacklevel=2)
        return None


def register(library: ctypes.CDLL, symbol: str, target: str) -> None:
    """Registers the FFI handler ``symbol`` of ``library`` as XLA:CPU custom call ``target``."""
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")


def register_simd_kernel(simd_check: str, symbol: str, target: str) -> bool:
    """Registers FFI handler ``symbol`` as ``target`` when the library builds and its
    ``simd_check`` says this CPU has the instructions the kernel needs; False otherwise."""
    library = load_library()
    if library is None:
        return False
    check = getattr(library, simd_check)
    check.restype = ctypes.c_bool
    if not check():
        return False
    register(library, symbol, target)
    return True
