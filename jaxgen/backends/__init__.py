"""Attention backends: each owns the KV pool's layout and allocation, the step's parameter
preparation and the attention kernels, and is chosen once per engine by :func:`select_backend`.

| name | where | kernels |
| --- | --- | --- |
| ``reference`` | anywhere | plain XLA (gathers pages) |
| ``pallas-tpu`` | TPU (interpreted on CPU) | ragged paged attention + in-place K/V write (Mosaic) |
| ``pallas-gpu`` | GPU of compute capability >= 8.0 (interpreted on CPU) | split-KV decode + ragged prefill kernels (Triton) |
| ``cpu`` | CPU, float32 | native C++ paged attention and matmul (XLA FFI; XLA matmuls under TP) |
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxgen.backends.base import KernelBackend
from jaxgen.backends.cpu import CPUBackend
from jaxgen.backends.cpu_kernels import cpu_kernel_available
from jaxgen.backends.device_choice import (
    DeviceDescription,
    auto_attention_backend,
    check_attention_backend,
    local_device,
)
from jaxgen.backends.reference import ReferenceBackend
from jaxgen.config.engine_config import BACKENDS
from jaxgen.quantization.kv_cache import validate_kv_cache_dtype

_PLATFORM_PALLAS = {"tpu": "pallas-tpu", "gpu": "pallas-gpu", "cuda": "pallas-gpu"}


def resolve_backend_name(
    name: str,
    *,
    dtype=jnp.float32,
    sharded: bool = False,
    platform: str | None = None,
    device: DeviceDescription | None = None,
) -> str:
    """The backend ``name`` means on ``device`` (default: a bare ``platform``'s description, or
    jax's default device, its compute capability read: ``device_choice.local_device``).

    ``auto``: ``device_choice.auto_attention_backend`` (``pallas-tpu`` on TPU, ``pallas-gpu``
    on a GPU of compute capability 8.0 and up and ``reference`` below it; on CPU ``cpu`` when
    the pool is float32, unsharded and the native kernels build, else ``reference``).
    ``pallas``: the Pallas kernels of the platform (``pallas-gpu`` on CPU, interpreted). A
    backend the device cannot compile (``pallas-gpu`` below 8.0) is a ``ValueError`` naming
    ``attention_backend``.
    """
    if name not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {BACKENDS}, got {name!r}")
    if device is None:
        device = DeviceDescription(platform) if platform else local_device()
    platform = device.platform
    check_attention_backend(device, name)
    if name == "pallas":
        return _PLATFORM_PALLAS.get(platform, "pallas-gpu")
    if name == "auto":
        # The native kernels' build is asked about only where they could run.
        cpu_kernels = platform == "cpu" and cpu_kernel_available()
        return auto_attention_backend(device, dtype=dtype, sharded=sharded, cpu_kernels=cpu_kernels)
    if name == "cpu":
        if platform != "cpu":
            raise ValueError("attention_backend='cpu' runs only on the CPU backend")
        if jnp.dtype(dtype) != jnp.float32:
            raise ValueError(f"attention_backend='cpu' needs dtype float32, got {jnp.dtype(dtype)}")
        if not cpu_kernel_available():
            raise ValueError("attention_backend='cpu': the kernel could not be built here")
    return name


def select_backend(
    name: str,
    *,
    dtype=jnp.float32,
    kv_sharding=None,
    platform: str | None = None,
    kv_cache_dtype: str = "auto",
    kernel_options: dict | None = None,
    device: DeviceDescription | None = None,
    batch_invariant: bool = False,
) -> KernelBackend:
    """The backend object for ``name`` on ``device`` (or ``platform``; see
    :func:`resolve_backend_name`); ``kv_sharding``: the
    paired-layout pool sharding of a tensor-parallel engine, whose mesh and head axis every
    backend takes (the TPU backend for its own layout). ``kv_cache_dtype`` "int8" / "fp8" (an
    8-bit pool): every backend's kernels read it (reference, cpu and pallas-gpu:
    ``QuantizedPages``; pallas-tpu: ``QuantizedKVPool``), under tensor parallelism too.
    ``kernel_options``: the pallas-gpu kernels' tuning arguments (``attention_kernel_options``);
    a ``ValueError`` for any other backend. ``batch_invariant``: the reference and cpu backends'
    batch-invariant step (jaxgen/backends/batch_invariant.py); a ``ValueError`` for the others."""
    validate_kv_cache_dtype(kv_cache_dtype)
    sharded = kv_sharding is not None and len(kv_sharding.device_set) > 1
    if device is None:
        device = DeviceDescription(platform) if platform else local_device()
    platform = device.platform
    resolved = resolve_backend_name(name, dtype=dtype, sharded=sharded, device=device)
    if kernel_options and resolved != "pallas-gpu":
        raise ValueError(
            f"attention_kernel_options: only the pallas-gpu backend takes kernel options; "
            f"attention_backend={name!r} runs {resolved!r}"
        )
    if batch_invariant and resolved not in ("reference", "cpu"):
        raise ValueError(
            f"batch_invariant: only the reference and cpu backends are batch-invariant; "
            f"attention_backend={name!r} runs {resolved!r}"
        )
    if resolved == "pallas-tpu":
        from jaxgen.backends.pallas_tpu import PallasTPUBackend

        interpret = platform == "cpu"
        if not sharded:
            return PallasTPUBackend(interpret=interpret, kv_cache_dtype=kv_cache_dtype)
        return PallasTPUBackend(
            mesh=kv_sharding.mesh,
            model_axis=kv_sharding.spec[0],
            interpret=interpret,
            kv_cache_dtype=kv_cache_dtype,
        )
    # Paired-pool backends: the pool split over KV heads as ``kv_sharding`` says.
    split = dict(mesh=kv_sharding.mesh, model_axis=kv_sharding.spec[0]) if sharded else {}
    if resolved == "pallas-gpu":
        if platform not in ("cpu", "gpu"):
            raise ValueError(
                f"attention_backend='pallas-gpu' runs on a CUDA GPU (or interpreted on the CPU), "
                f"not on the {platform} platform"
            )
        interpret = platform == "cpu"
        from jaxgen.backends.pallas_gpu import PallasGPUBackend

        return PallasGPUBackend(
            interpret=interpret,
            kv_cache_dtype=kv_cache_dtype,
            tuning=tuple(sorted((kernel_options or {}).items())),
            **split,
        )
    backend = {"reference": ReferenceBackend, "cpu": CPUBackend}[resolved]
    return backend(kv_cache_dtype=kv_cache_dtype, batch_invariant=batch_invariant, **split)


def __getattr__(name: str):
    """The Pallas backends load on first use: they import Pallas and their kernels, which a
    run on the CPU backend never needs."""
    if name == "PallasGPUBackend":
        from jaxgen.backends.pallas_gpu import PallasGPUBackend

        return PallasGPUBackend
    if name == "PallasTPUBackend":
        from jaxgen.backends.pallas_tpu import PallasTPUBackend

        return PallasTPUBackend
    raise AttributeError(f"module 'jaxgen.backends' has no attribute {name!r}")


__all__ = [
    "BACKENDS",
    "KernelBackend",
    "CPUBackend",
    "PallasGPUBackend",
    "PallasTPUBackend",
    "ReferenceBackend",
    "resolve_backend_name",
    "select_backend",
]
