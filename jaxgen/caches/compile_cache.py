"""The persistent compilation cache: XLA executables kept on disk between runs.

On by default in ``$JAXGEN_CACHE_DIR/xla`` (default ``~/.cache/jaxgen/xla``, beside the native
CPU kernels in ``kernels/``), keyed as JAX keys them (the computation, compile options, jax and
XLA versions, devices), so a second run of the same job compiles nothing. Off with
``JAXGEN_COMPILE_CACHE=0`` or the ``compile_cache`` knob (``--no-compile-cache``); a
``jax_compilation_cache_dir`` the user set is left as it is. A directory that cannot be written
gives a warning and a run without the cache; an entry that cannot be read is recompiled (JAX
warns). Concurrent processes may share the directory: an entry is written once under its key,
and a reader that meets a half-written one recompiles.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

ENV_SWITCH = "JAXGEN_COMPILE_CACHE"
_OFF_VALUES = ("0", "false", "no", "off")


def cache_root() -> Path:
    """``$JAXGEN_CACHE_DIR``, default ``~/.cache/jaxgen``: jaxgen's on-disk caches live under it."""
    return Path(os.environ.get("JAXGEN_CACHE_DIR") or Path.home() / ".cache" / "jaxgen")


def enabled_by_environment() -> bool:
    """False when ``JAXGEN_COMPILE_CACHE`` is 0 / false / no / off."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in _OFF_VALUES


def enable_compile_cache(enabled: bool = True) -> str | None:
    """Points JAX's persistent compilation cache at ``cache_root() / "xla"`` (once per process;
    later calls return the directory in use). Returns the directory, or None when the cache is
    off: ``enabled`` False, ``JAXGEN_COMPILE_CACHE`` off, or the directory not writable (then
    with a warning)."""
    import jax

    current = jax.config.jax_compilation_cache_dir
    if current:  # set by the user, or by an earlier call
        return current
    if not enabled or not enabled_by_environment():
        return None
    directory = cache_root() / "xla"
    problem = _unwritable(directory)
    if problem is not None:
        warnings.warn(
            f"compilation cache off: {directory} is not writable ({problem}); set "
            f"JAXGEN_CACHE_DIR to a writable directory or {ENV_SWITCH}=0",
            stacklevel=2,
        )
        return None
    # Every executable is worth keeping: the engine's steps compile in well under JAX's default
    # 1 s threshold on small models, and a second run should compile none of them.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    return str(directory)


def _unwritable(directory: Path) -> str | None:
    """Why files cannot be created in ``directory`` (made if missing), or None if they can."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-"):
            pass
    except OSError as error:
        return error.strerror or str(error)
    return None
