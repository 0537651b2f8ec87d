"""Threads that compile grammars: a large native stack each, and a bounded queue.

llguidance builds a grammar recursively in native code; on a thread's default 8 MiB stack a
deep enough grammar overflows it, which kills the process (no Python exception is possible).
``StructuredOutputLimits`` refuses such grammars before they are built; these threads are the
second guard, with 32 times that stack (address space: only the pages a compile touches are
ever committed; the threads start with the first compile). A full queue refuses work at once
(``QueueFull``) instead of letting compiles pile up; work still queued can be cancelled
(``Future.cancel``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future

GRAMMAR_STACK_BYTES = 256 << 20
_STACK_SIZE_LOCK = threading.Lock()  # threading.stack_size is process-wide


class QueueFull(RuntimeError):
    """The threads already hold ``max_pending`` compiles (running or queued)."""


class GrammarThreads:
    """``workers`` daemon threads with ``GRAMMAR_STACK_BYTES`` of stack, running submitted
    calls in order; at most ``max_pending`` (None: no bound) run or wait at once."""

    def __init__(self, workers: int, *, max_pending: int | None = None, name: str = "grammar"):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.max_pending = max_pending
        self.workers = workers
        self.pending = 0
        self.name = name
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._started = False
        self._closed = False

    def submit(self, fn: Callable, *args) -> Future:
        """Runs ``fn(*args)`` on a thread; raises ``QueueFull`` when ``max_pending`` calls are
        already running or waiting."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"the {self.name} threads are shut down")
            if self.max_pending is not None and self.pending >= self.max_pending:
                raise QueueFull(f"{self.pending} grammar compiles are already pending")
            self.pending += 1
            if not self._started:
                self._start()
        future: Future = Future()
        self._queue.put((future, fn, args))
        return future

    def run(self, fn: Callable, *args):
        """``fn(*args)`` on a thread, waited for (its exception re-raised here)."""
        return self.submit(fn, *args).result()

    def shutdown(self) -> None:
        """Stops the threads once the work queued before this call is done."""
        with self._lock:
            self._closed = True
            if self._started:
                for _ in range(self.workers):
                    self._queue.put(None)

    def _start(self) -> None:
        with _STACK_SIZE_LOCK:
            previous = threading.stack_size(GRAMMAR_STACK_BYTES)
            try:
                for index in range(self.workers):
                    name = f"jaxgen-{self.name}-{index}"
                    threading.Thread(target=self._work, name=name, daemon=True).start()
            finally:
                threading.stack_size(previous)
        self._started = True

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args = item
            try:
                if future.set_running_or_notify_cancel():  # False: cancelled while queued
                    try:
                        result = fn(*args)
                    except BaseException as error:  # noqa: BLE001 - handed to the caller
                        future.set_exception(error)
                    else:
                        future.set_result(result)
            finally:
                with self._lock:
                    self.pending -= 1


_DEFAULT: GrammarThreads | None = None
_DEFAULT_LOCK = threading.Lock()


def default_grammar_threads() -> GrammarThreads:
    """The process's shared threads (two, unbounded) for compiles nobody else schedules
    (``LLM``, ``AsyncLLM`` and the engine's own)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = GrammarThreads(2, name="grammar-default")
        return _DEFAULT
