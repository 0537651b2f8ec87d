"""The Starlette app: routes, error handlers, and a lifespan that loads, serves and drains."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from serving import admin_routes, invocations
from serving.metrics import ServerMetrics, watch_engine_steps
from serving.middleware import ApiKeyMiddleware, RequestIdMiddleware
from serving.openai import (
    embedding_routes,
    lora_routes,
    responses_routes,
    score_routes,
    tokenize_routes,
)
from serving.openai import routes as openai_routes
from serving.openapi import openapi_route
from serving.pooling import refuse_generation_on_pooling
from serving.settings.resolve import ServerSettings
from serving.state import FAILED, LOADING, READY, ServerState
from serving.streaming import ClientDisconnected
from serving.tgi import format as tgi_format
from serving.tgi import routes as tgi_routes
from serving.validation import RequestError

logger = logging.getLogger("serving")

CLIENT_CLOSED_REQUEST = 499


def create_app(
    llm,
    settings: ServerSettings | None = None,
    *,
    on_fatal: Callable[[BaseException], None] | None = None,
    metric_labels: dict[str, str] | None = None,
) -> Starlette:
    """Builds the server app.

    Args:
        llm: a running ``AsyncLLM`` (the caller owns it), or a zero-argument callable that
            builds one; it is then loaded on a thread at startup (``/health`` answers 503
            meanwhile) and shut down with the app.
        settings: limits and names (``ServerSettings()`` by default).
        on_fatal: called if loading fails (the CLI uses it to exit).
        metric_labels: labels added to every metric sample (a Ray Serve replica's id).
    """
    settings = settings or ServerSettings()
    metrics = ServerMetrics(metric_labels)
    state = ServerState(settings, metrics)
    owned = callable(llm) and not hasattr(llm, "generate")
    unsubscribe: list[Callable[[], None]] = []

    def attach(engine) -> None:
        state.attach(engine)
        metrics.stats_source = engine.stats
        unsubscribe.append(watch_engine_steps(engine, metrics.batch_size.observe))

    def loaded(engine) -> None:
        if state.phase != LOADING:  # shut down while loading
            engine.shutdown()
            return
        try:
            attach(engine)
        except Exception as error:
            engine.shutdown()
            failed(error)
        else:
            logger.info("model loaded; ready")

    def failed(error: BaseException) -> None:
        state.phase = FAILED
        state.load_error = error
        logger.error("model failed to load: %s", error)
        if on_fatal is not None:
            on_fatal(error)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        state.loop = asyncio.get_running_loop()
        if owned:
            start_loading(llm, state.loop, loaded, failed)
        else:
            attach(llm)
        try:
            yield
        finally:
            await state.drain(settings.drain_timeout)
            state.workers.shutdown()
            for stop in unsubscribe:
                stop()
            if owned and state.llm is not None:
                await asyncio.to_thread(state.llm.shutdown)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/ping", health, methods=["GET"]),
        Route("/metrics", metrics_route, methods=["GET"]),
        *tgi_routes.ROUTES,
        *openai_routes.ROUTES,
        *lora_routes.ROUTES,
        *responses_routes.ROUTES,
        *tokenize_routes.ROUTES,
        *embedding_routes.ROUTES,
        *score_routes.ROUTES,
        *invocations.ROUTES,
        *admin_routes.ROUTES,
    ]
    pooling = [*embedding_routes.ROUTES, *score_routes.ROUTES, *tokenize_routes.ROUTES]
    routes = refuse_generation_on_pooling(routes, keep=pooling)
    routes.append(openapi_route(list(routes)))
    handlers = {
        HTTPException: http_error,
        ClientDisconnected: client_gone,
        RequestError: request_error,
        Exception: internal_error,
    }
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers=handlers,
        middleware=middleware(settings),
    )
    app.state.server = state
    return app


def middleware(settings: ServerSettings) -> list[Middleware]:
    """CORS outermost (preflights and 401s carry its headers), then ``X-Request-Id``, then the
    API key when one is set."""
    stack = [
        Middleware(
            CORSMiddleware,
            allow_origins=list(settings.allowed_origins),
            allow_methods=list(settings.allowed_methods),
            allow_headers=list(settings.allowed_headers),
            allow_credentials=settings.allow_credentials,
            expose_headers=["x-request-id"],
        ),
        Middleware(RequestIdMiddleware),
    ]
    if settings.api_key:
        stack.append(Middleware(ApiKeyMiddleware, api_key=settings.api_key))
    return stack


def start_loading(loader: Callable, loop: asyncio.AbstractEventLoop, loaded, failed) -> None:
    """Runs ``loader()`` on a daemon thread and reports back on the event loop."""

    def work() -> None:
        try:
            engine = loader()
        except BaseException as error:  # noqa: BLE001 - reported to the app
            loop.call_soon_threadsafe(failed, error)
        else:
            loop.call_soon_threadsafe(loaded, engine)

    threading.Thread(target=work, name="jaxgen-load", daemon=True).start()


async def health(request: Request) -> Response:
    """``GET /health``: 200 when ready, 503 while loading, draining, or failed (the model did
    not load or the engine died)."""
    state: ServerState = request.app.state.server
    status = state.status
    body = {"status": "ok" if status == READY else status}
    if state.engine_error is not None:
        body["error"] = str(state.engine_error)
    return JSONResponse(body, status_code=200 if status == READY else 503)


async def metrics_route(request: Request) -> Response:
    """``GET /metrics``: Prometheus text format."""
    state: ServerState = request.app.state.server
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


def render_error(request: Request, error: RequestError) -> Response:
    if request.url.path.startswith("/v1"):
        return openai_routes.openai_error(error)
    return tgi_format.tgi_error(error)


async def request_error(request: Request, error: RequestError) -> Response:
    return render_error(request, error)


async def http_error(request: Request, error: HTTPException) -> Response:
    kind = "not_found" if error.status_code == 404 else "validation"
    response = render_error(request, RequestError(str(error.detail), kind=kind))
    response.status_code = error.status_code
    if error.headers:
        response.headers.update(error.headers)
    return response


async def client_gone(request: Request, error: ClientDisconnected) -> Response:
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def internal_error(request: Request, error: Exception) -> Response:
    logger.exception("unhandled error on %s %s", request.method, request.url.path)
    return render_error(request, RequestError("internal server error", kind="internal"))
