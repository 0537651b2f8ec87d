"""Errors an engine step raises, so front ends can tell a failed step from a dead engine; and
those of its sleep mode and weight updates (``jaxgen.engine.weights``)."""

from __future__ import annotations


class StepFailed(RuntimeError):
    """One step raised and the engine recovered; only the requests in that step failed.

    Args:
        error: what the step raised.
        request_ids: the requests that were in the step (already removed from the engine).
        outputs: outputs the same step produced elsewhere (other replicas), to deliver as usual.
    """

    def __init__(self, error: BaseException, request_ids: list[str], outputs=None):
        super().__init__(f"engine step failed: {error!r}")
        self.error = error
        self.request_ids = request_ids
        self.outputs = list(outputs or [])


class EngineDeadError(RuntimeError):
    """The engine cannot run steps any more (recovery failed, or every step keeps failing).

    ``request_ids`` are the requests of the step that killed it (already removed from the
    engine); the engine's other requests are still there for the caller to end.
    """

    def __init__(self, message: str, request_ids: list[str] | None = None):
        super().__init__(message)
        self.request_ids = list(request_ids or [])


class EngineBusyError(RuntimeError):
    """``sleep`` or ``update_weights`` asked of an engine with unfinished requests: refused
    (vLLM's sleep mode needs an idle engine), and the requests go on."""


class SleepModeError(RuntimeError):
    """A sleep-mode call the engine's state does not allow: ``sleep`` while asleep, ``wake_up``
    while awake, ``update_weights`` while the weights wait on the host (level 1), waking weights
    that ``sleep(level=2)`` discarded."""


class EngineSleepingError(SleepModeError):
    """A request (or a precompile) for an engine that is asleep: ``wake_up()`` first."""
