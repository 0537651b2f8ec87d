"""What the engine tells after each step that ran: ``StepEvent``, and the ``StepObservers``
that subscribe to it (the server's Prometheus metrics, ``jaxgen bench``, tests).

Every engine mode records its steps through ``LLMEngine.record_step`` (plain, asynchronous
step-ahead, multi-step, speculative verify, beam search), which emits one event per call. An
observer runs on the engine's thread, right after the step's tokens were read and before they
are handed to the requests; one that raises is logged and never breaks the step.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable

logger = logging.getLogger("jaxgen")


@dataclasses.dataclass(frozen=True)
class StepEvent:
    """One step that ran.

    Attributes:
        batch_size: sequences the step scheduled.
        num_steps: decode steps it ran (more than 1: a multi-step call).
        seconds: the host's time for it, from its launch (or the previous step's read, when
            that came later: overlapped steps are not counted twice) to its read.
        compiles: XLA compiles (or executables loaded) in the process since the last event.
        mode: ``"plain"``, ``"ahead"`` (launched before the previous step was read),
            ``"verify"`` (speculative) or ``"beam"``.
    """

    batch_size: int
    num_steps: int
    seconds: float
    compiles: int
    mode: str


class StepObservers:
    """Callbacks called with each ``StepEvent``; ``add`` returns the unsubscriber."""

    def __init__(self):
        self._callbacks: tuple[Callable[[StepEvent], None], ...] = ()
        self._lock = threading.Lock()

    def add(self, callback: Callable[[StepEvent], None]) -> Callable[[], None]:
        with self._lock:
            self._callbacks += (callback,)

        def unsubscribe() -> None:
            with self._lock:
                self._callbacks = tuple(c for c in self._callbacks if c is not callback)

        return unsubscribe

    def __len__(self) -> int:
        return len(self._callbacks)

    def emit(self, event: StepEvent) -> None:
        for callback in self._callbacks:  # a snapshot: one may unsubscribe meanwhile
            try:
                callback(event)
            except Exception:  # an observer's failure must never break a step
                logger.exception("a step observer failed")
