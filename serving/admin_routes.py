"""Routes for RL post-training, behind the API key like every route but /health, /ping and
/metrics: vLLM's sleep mode (``POST /sleep?level=1|2``, ``POST /wake_up`` with optional
``?tags=weights&tags=kv_cache``, ``GET /is_sleeping``) and SGLang's ``POST
/update_weights_from_disk`` (``{"model_path": ...}``: an HF checkpoint directory or a ``jaxgen
convert`` directory, read in the model's dtype and quantisation; ``jaxgen.engine.weights``).

Sleeping and new weights need an idle engine: with requests in flight they are refused (409,
the requests go on). While the model sleeps, generation requests get a 503 with ``Retry-After``
(``ServerState.admit``); ``/update_weights_from_disk`` after ``/sleep?level=2`` is how the
weights come back before ``/wake_up``.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from jaxgen.engine.errors import EngineBusyError, SleepModeError
from serving.common import accept, server_state
from serving.openai.routes import openai_error
from serving.state import READY, ServerState
from serving.validation import RequestError


def _ready(state: ServerState) -> None:
    if state.llm is None or state.status != READY:
        state.admit()  # raises the right 503


def _idle(state: ServerState, what: str) -> None:
    if state.in_flight:
        raise RequestError(
            f"{what} needs an idle server: {state.in_flight} request(s) are in flight; "
            "let them finish first",
            kind="conflict",
        )


async def sleep(request: Request) -> Response:
    """Frees the KV pool and the weights (``level`` 1: weights kept on the host; 2: dropped)."""
    state = server_state(request)
    try:
        _ready(state)
        raw = request.query_params.get("level", "1")
        if not raw.isdigit() or int(raw) not in (1, 2):
            raise RequestError(f"`level` must be 1 or 2, got {raw!r}", param="level")
        _idle(state, "sleep")
        await state.llm.sleep(int(raw))
    except RequestError as error:
        return openai_error(error)
    except (EngineBusyError, SleepModeError) as error:
        return openai_error(RequestError(str(error), kind="conflict"))
    return Response(status_code=200)


async def wake_up(request: Request) -> Response:
    """Takes back what ``/sleep`` freed (``tags``: weights, kv_cache; none: both)."""
    state = server_state(request)
    try:
        _ready(state)
        tags = request.query_params.getlist("tags") or None
        try:
            await state.llm.wake_up(tags)
        except ValueError as error:
            raise RequestError(str(error), param="tags") from None
    except RequestError as error:
        return openai_error(error)
    except SleepModeError as error:
        return openai_error(RequestError(str(error), kind="conflict"))
    return Response(status_code=200)


async def is_sleeping(request: Request) -> Response:
    """``{"is_sleeping": bool}``: whether any part of the engine sleeps."""
    state = server_state(request)
    try:
        _ready(state)
    except RequestError as error:
        return openai_error(error)
    return JSONResponse({"is_sleeping": await state.llm.is_sleeping()})


async def update_weights_from_disk(request: Request) -> Response:
    """SGLang's route: ``{"success": true, "message": ...}``, or ``false`` with the reason (400
    for a checkpoint that does not fit, the old weights staying; 409 while busy)."""
    try:
        state, body = await accept(request)
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            raise RequestError("`model_path` must be a non-empty string", param="model_path")
        _idle(state, "update_weights_from_disk")
        await state.llm.update_weights_from_path(path)
    except RequestError as error:
        status = 503 if error.kind == "unavailable" else 409 if error.kind == "conflict" else 400
        return _answer(False, error.message, status, error.headers)
    except ValueError as error:
        return _answer(False, str(error), 400)
    except (EngineBusyError, SleepModeError) as error:
        return _answer(False, str(error), 409)
    return _answer(True, "Succeeded to update model weights.", 200)


def _answer(success: bool, message: str, status: int, headers=None) -> JSONResponse:
    return JSONResponse({"success": success, "message": message}, status, headers=headers)


ROUTES = [
    Route("/sleep", sleep, methods=["POST"]),
    Route("/wake_up", wake_up, methods=["POST"]),
    Route("/is_sleeping", is_sleeping, methods=["GET"]),
    Route("/update_weights_from_disk", update_weights_from_disk, methods=["POST"]),
]
