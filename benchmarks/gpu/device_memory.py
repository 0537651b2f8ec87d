"""The device check's own GPU memory: what the parent process holds, for a child stage to
leave, and handing it back before the child stages."""

from __future__ import annotations

from benchmarks.gpu.report import command_output

_state = {"released": False}


def reset() -> None:
    """A new run (the dry-run test runs several in one process)."""
    _state["released"] = False


def released() -> bool:
    return _state["released"]


def parent_bytes() -> int:
    """Device bytes this process's allocator may still hold (its peak), for a child to leave."""
    if _state["released"]:
        return 0
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return int(stats.get("peak_bytes_in_use", 0))


def gpu_memory_used() -> str | None:
    """nvidia-smi's reading of the GPU's used memory (None without it)."""
    return command_output(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"])


def release() -> dict:
    """Hands this process's device memory back before the child stages: the in-process stages'
    arrays deleted and the client closed (XLA's allocator keeps what it once held otherwise: 21 GB
    after the kernel stages on an H100, where batch 256 of the 8B then ran out of memory)."""
    import gc

    import jax
    from jax.extend import backend

    before = {"peak_bytes": parent_bytes(), "gpu_used_before": gpu_memory_used()}
    for array in jax.live_arrays():
        array.delete()
    jax.clear_caches()
    backend.clear_backends()
    gc.collect()
    _state["released"] = True
    return {**before, "gpu_used_after": gpu_memory_used()}
