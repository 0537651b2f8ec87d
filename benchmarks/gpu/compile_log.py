"""Every XLA compile of the process, logged with its duration, function and the current label
(the stage or step that caused it); persistent-cache hits counted beside them."""

from __future__ import annotations

import threading

import jax

from benchmarks.gpu.report import log

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
CACHE_HIT = "/jax/compilation_cache/cache_hits"


class CompileLog:
    """Counts and times backend compiles (a persistent-cache hit counts too: jax times its load
    as a compile); ``label`` names what is running."""

    def __init__(self, quiet_below_s: float = 0.5):
        self.count = 0
        self.seconds = 0.0
        self.cache_hits = 0
        self.label = ""
        self.quiet_below_s = quiet_below_s
        self.entries: list[dict] = []
        self._lock = threading.Lock()
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        jax.monitoring.register_event_listener(self._on_event)

    def _on_duration(self, event: str, duration: float, **kwargs) -> None:
        if event != BACKEND_COMPILE:
            return
        with self._lock:
            self.count += 1
            self.seconds += duration
            name = str(kwargs.get("fun_name", ""))
            self.entries.append({"label": self.label, "function": name, "seconds": duration})
        if duration >= self.quiet_below_s:
            log(f"compile {duration:.1f} s: {name} ({self.label})")

    def _on_event(self, event: str, **kwargs) -> None:
        if event == CACHE_HIT:
            with self._lock:
                self.cache_hits += 1

    def snapshot(self) -> tuple[int, float]:
        return self.count, self.seconds

    def since(self, snapshot: tuple[int, float]) -> dict:
        """Compiles and their seconds since ``snapshot``."""
        return {"compiles": self.count - snapshot[0], "compile_s": self.seconds - snapshot[1]}


def enable_persistent_cache(directory: str | None) -> None:
    """Executables compiled in over a second go to ``directory`` (None: off), so a rerun on the
    same machine, or a later stage's process, loads instead of compiling."""
    if directory:
        jax.config.update("jax_compilation_cache_dir", directory)
