"""Counts XLA compilations (exposed in ``stats()['compiles']``): executables compiled, or loaded
from the persistent compilation cache (``jaxgen.caches.compile_cache``) in place of a compile, so
the count does not depend on what the cache holds; ``stats()['compile_cache_hits']`` counts the
loaded ones."""

from __future__ import annotations

import threading

import jax

_lock = threading.Lock()
_count = 0
_cache_hits = 0
_installed = False
_COMPILED = "/jax/core/compile/backend_compile_duration"
_LOADED = "/jax/compilation_cache/cache_retrieval_time_sec"  # recorded on a cache hit only


def _listener(event: str, duration: float, **kwargs) -> None:
    global _count, _cache_hits
    if event in (_COMPILED, _LOADED):
        with _lock:
            _count += 1
            _cache_hits += event == _LOADED


def install() -> None:
    """Registers the listener once per process."""
    global _installed
    with _lock:
        if not _installed:
            jax.monitoring.register_event_duration_secs_listener(_listener)
            _installed = True


def compile_count() -> int:
    """XLA compilations in this process since ``install()`` (cache hits included)."""
    return _count


def cache_hit_count() -> int:
    """Compilations since ``install()`` that the persistent cache answered."""
    return _cache_hits


def record_loaded() -> None:
    """Counts an executable loaded from jaxgen's executable store (``executable_store``): a
    compilation answered by a cache, as the persistent cache's hits are."""
    global _count, _cache_hits
    with _lock:
        _count += 1
        _cache_hits += 1
