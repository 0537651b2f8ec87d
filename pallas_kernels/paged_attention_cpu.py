"""Paged decode attention for XLA:CPU as a native kernel (C++ through the XLA FFI).

The pure-JAX reference (``paged_attention_reference``) gathers every sequence's pages into a
temporary and transposes it for the batched dot; on a CPU those copies cost more than the
attention itself. This kernel reads keys and values page by page from the pool instead. It is
compiled from ``cpu/paged_attention_cpu.cc`` with the machine's C++ compiler on first use and
cached (``$JAXGEN_CACHE_DIR``, default ``~/.cache/jaxgen``); where no compiler is found,
``cpu_kernel_available()`` is False and callers keep the reference.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.paged_attention import validate_common, validate_int_array

SOURCE = Path(__file__).parent / "cpu" / "paged_attention_cpu.cc"
TARGET = "jaxgen_paged_decode_f32"
# Reassociation lets the compiler vectorise the dot-product reductions; nothing else is relaxed.
CXX_FLAGS = (
    "-O3",
    "-march=native",
    "-std=c++17",
    "-shared",
    "-fPIC",
    "-fno-math-errno",
    "-fassociative-math",
    "-fno-signed-zeros",
    "-fno-trapping-math",
)


def _cache_dir() -> Path:
    root = os.environ.get("JAXGEN_CACHE_DIR") or os.path.join(Path.home(), ".cache", "jaxgen")
    return Path(root) / "kernels"


def _build(compiler: str) -> Path:
    """Compiles the kernel into the cache (keyed by source, flags and jaxlib) unless present."""
    import jaxlib

    key = hashlib.sha256(
        SOURCE.read_bytes() + " ".join(CXX_FLAGS).encode() + jaxlib.__version__.encode()
    ).hexdigest()[:16]
    library = _cache_dir() / f"paged_attention_cpu-{key}.so"
    if library.exists():
        return library
    library.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library.parent) as tmp:
        partial = Path(tmp) / library.name
        command = [compiler, *CXX_FLAGS, f"-I{jax.ffi.include_dir()}", str(SOURCE), "-o", partial]
        subprocess.run(command, check=True, capture_output=True, text=True)
        os.replace(partial, library)  # atomic: concurrent builders never see half a file
    return library


@functools.cache
def cpu_kernel_available() -> bool:
    """Builds and registers the kernel once; False (with a warning) when that is not possible."""
    if os.environ.get("JAXGEN_DISABLE_CPU_KERNELS"):
        return False
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        return False
    try:
        library = ctypes.cdll.LoadLibrary(str(_build(compiler)))
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or error
        warnings.warn(
            f"CPU paged-attention kernel unavailable, using the reference: {detail}", stacklevel=2
        )
        return False
    capsule = jax.ffi.pycapsule(library.JaxgenPagedDecodeF32)
    jax.ffi.register_ffi_target(TARGET, capsule, platform="cpu")
    return True


def paged_attention_cpu(
    q: jax.Array,  # [B, Hq, D] float32
    k_pages: jax.Array,  # [Hkv, P, S, D] float32
    v_pages: jax.Array,  # [Hkv, P, S, D] float32
    lengths: jax.Array,  # [B] int32
    block_tables: jax.Array,  # [B, W] int32
    *,
    scale: float | None = None,
    soft_cap: float | None = None,
    sliding_window: int | None = None,
) -> jax.Array:  # [B, Hq, D]
    """Paged decode attention on XLA:CPU; same contract as ``paged_attention_reference``."""
    batch, num_heads, head_dim = q.shape
    validate_common(
        q, k_pages, v_pages, scale=scale, soft_cap=soft_cap, sliding_window=sliding_window
    )
    validate_int_array("lengths", lengths, (batch,))
    validate_int_array("block_tables", block_tables, (batch, block_tables.shape[-1]))
    for name, array in (("q", q), ("k_pages", k_pages), ("v_pages", v_pages)):
        if array.dtype != jnp.float32:
            raise ValueError(f"{name} must be float32 for the CPU kernel, got {array.dtype}")
    if not cpu_kernel_available():
        raise RuntimeError("the CPU paged-attention kernel could not be built on this machine")
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(q.shape, q.dtype))
    return call(
        q,
        k_pages,
        v_pages,
        lengths,
        block_tables,
        scale=np.float32(head_dim**-0.5 if scale is None else scale),
        soft_cap=np.float32(soft_cap or 0.0),
        sliding_window=np.int64(sliding_window or 0),
    )
