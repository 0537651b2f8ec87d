"""What every executable the store keeps depends on beyond its own function: the versions, the
device, jax's numeric settings, the ``JAX*`` / ``XLA*`` / ``JAXGEN*`` environment, the host CPU's
instruction set and the jaxgen sources (``jaxgen.engine.compiled.executable_store`` names its files by a
hash of it with each function's signature)."""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import jax

_FORMAT = 1  # bump when what a stored file holds changes
_ENV_PREFIXES = ("JAX", "XLA", "JAXGEN")
_ENV_IGNORED = (
    "JAXGEN_CACHE_DIR",
    "JAXGEN_COMPILE_CACHE",
    "JAX_COMPILATION_CACHE_DIR",
    "JAX_LOG_COMPILES",
)


@functools.lru_cache(maxsize=1)
def process_context() -> str:
    """What every stored executable of this process depends on beyond its own function."""
    import flax
    import jaxlib

    device = jax.devices()[0]
    environment = sorted(
        (k, v)
        for k, v in os.environ.items()
        if k.startswith(_ENV_PREFIXES) and k not in _ENV_IGNORED
    )
    settings = (
        jax.config.jax_enable_x64,
        jax.config.jax_default_matmul_precision,
        jax.config.jax_default_prng_impl,
    )
    return "\n".join(
        map(
            str,
            (
                _FORMAT,
                jax.__version__,
                jaxlib.version.__version__,
                flax.__version__,
                device.platform,
                device.device_kind,
                jax.device_count(),
                jax.process_count(),
                settings,
                environment,
                _cpu_features() if device.platform == "cpu" else "",
                source_hash(),
            ),
        )
    )


def _cpu_features() -> str:
    """The host CPU's model and instruction-set flags (an XLA:CPU executable is compiled for
    them: a cache directory shared with another machine must not hand it over)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        import platform

        return platform.processor() or platform.machine()
    wanted = ("model name", "flags", "Features", "CPU part")
    return "\n".join(sorted({line for line in lines if line.startswith(wanted)}))


@functools.lru_cache(maxsize=1)
def source_hash() -> str:
    """sha256 of the jaxgen and pallas_kernels sources (every ``.py`` and ``.cc`` file)."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for package in ("jaxgen", "pallas_kernels"):
        for path in sorted((root / package).rglob("*")):
            if path.suffix in (".py", ".cc", ".h") and path.is_file():
                digest.update(str(path.relative_to(root)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()
