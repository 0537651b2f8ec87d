"""Loads the native XLA:CPU kernels under ``native/``: the library ``pip install`` built, else
one built on first use (the engine factory starts that on a thread before the model loads:
``build_in_background``).

``pip install`` compiles the kernels into the package (``compile.build_installed``, run by
``setup.py``); a run loads that library where it still matches (``compile.installed_library``:
the same sources, flags, CPU, and an FFI API the running jaxlib serves). Otherwise every
``native/*.cc`` is compiled with the machine's C++ compiler against jaxlib's FFI headers and
linked into one shared library (so the kernels share one worker pool, ``native/parallel_for.h``),
cached under ``$JAXGEN_CACHE_DIR`` (default ``~/.cache/jaxgen``) and keyed by the sources, the
flags, jaxlib and the CPU. ``JAXGEN_DISABLE_CPU_KERNELS=1``, a missing compiler (with a warning)
or a failed build make ``load_library`` return None, and callers keep their pure-JAX path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import threading
import warnings
from pathlib import Path

import jax

from jaxgen.backends.cpu_kernels.compile import (
    CXX_FLAGS,
    compile_library,
    cpu_signature,
    ffi_api_version,
    find_compiler,
    installed_library,
    source_digest,
)
from jaxgen.caches.compile_cache import cache_root


def _cache_dir() -> Path:
    return cache_root() / "kernels"


def _build(compiler: str) -> Path:
    """Compiles every ``native/*.cc`` into the cache unless an identical build is there."""
    import jaxlib

    digest = hashlib.sha256(source_digest().encode())
    digest.update(" ".join(CXX_FLAGS).encode() + jaxlib.__version__.encode())
    digest.update(cpu_signature().encode())
    library = _cache_dir() / f"jaxgen_cpu_kernels-{digest.hexdigest()[:16]}.so"
    if not library.exists():
        compile_library(compiler, Path(jax.ffi.include_dir()), library)
    return library


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
    installed = installed_library(ffi_api_version(Path(jax.ffi.include_dir())))
    if installed is not None:
        try:
            return ctypes.cdll.LoadLibrary(str(installed))
        except OSError as error:
            warnings.warn(
                f"installed native CPU kernels do not load, building them: {error}", stacklevel=2
            )
    compiler = find_compiler()
    if compiler is None:
        warnings.warn(
            "native CPU kernels unavailable: no C++ compiler (install g++ or set CXX); "
            "the CPU backend runs its pure-JAX path",
            stacklevel=2,
        )
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
