"""Errors an engine step raises, so front ends can tell a failed step from a dead engine."""

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
