"""Counts XLA compilations (exposed in ``stats()['compiles']``)."""

from __future__ import annotations

import threading

import jax

_lock = threading.Lock()
_count = 0
_installed = False
_EVENT = "/jax/core/compile/backend_compile_duration"


def _listener(event: str, duration: float, **kwargs) -> None:
    global _count
    if event == _EVENT:
        with _lock:
            _count += 1


def install() -> None:
    """Registers the listener once per process."""
    global _installed
    with _lock:
        if not _installed:
            jax.monitoring.register_event_duration_secs_listener(_listener)
            _installed = True


def compile_count() -> int:
    """XLA compilations in this process since ``install()``."""
    return _count
