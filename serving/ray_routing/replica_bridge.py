"""A request the ingress forwards to an engine replica, and the replica's side of it: jaxgen's
ASGI app run in-process on the buffered body, its ASGI messages yielded in batches.

The ingress reads the whole body before routing (the router needs the prompt), so the app gets
it in one ``http.request`` message; after that, ``receive`` waits until the forwarded call ends,
then reports ``http.disconnect`` (which makes the app abort its engine request). Ending the
generator early (the ingress cancelled the call: its client left) ends the app the same way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from typing import Any

from serving.ray_routing.routing_text import RoutingText

logger = logging.getLogger("serving")

# The parts of an HTTP scope a replica needs (the rest may hold objects that do not pickle).
SCOPE_KEYS = (
    "type",
    "asgi",
    "http_version",
    "method",
    "scheme",
    "path",
    "raw_path",
    "query_string",
    "root_path",
    "headers",
    "client",
    "server",
)
APP_EXIT_GRACE_S = 5.0  # how long an ended call waits for the app to abort its request


@dataclasses.dataclass(frozen=True)
class ForwardedRequest:
    """An HTTP request, body read, as the ingress hands it to an engine replica.

    ``routing`` is what the prefix router matches (``serving.ray_routing.routing_text``).
    """

    scope: dict[str, Any]
    body: bytes
    routing: RoutingText = RoutingText()

    @classmethod
    def from_scope(
        cls, scope: dict, body: bytes, routing: RoutingText | None = None
    ) -> ForwardedRequest:
        plain = {key: scope[key] for key in SCOPE_KEYS if key in scope}
        plain["headers"] = [(bytes(k), bytes(v)) for k, v in scope.get("headers", [])]
        return cls(scope=plain, body=body, routing=routing or RoutingText())


_DONE = object()


async def serve_forwarded(app, request: ForwardedRequest) -> AsyncIterator[list[dict]]:
    """Runs ``app`` on ``request``; yields the ASGI messages it sends, a batch at a time (what
    was sent since the last batch). An exception the app raises is raised here after the
    messages it sent before, unless its response was complete (Starlette answers 500, then
    re-raises): that one is logged, as uvicorn would."""
    messages: asyncio.Queue = asyncio.Queue()
    ended = asyncio.Event()
    body_given = False
    complete = False

    async def receive() -> dict:
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await ended.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        nonlocal complete
        if ended.is_set():
            raise OSError("the forwarded request has ended")  # as a closed socket would
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            complete = True
        messages.put_nowait(message)

    task = asyncio.ensure_future(app(dict(request.scope), receive, send))
    task.add_done_callback(lambda _: messages.put_nowait(_DONE))
    try:
        while True:
            batch = [await messages.get()]
            while not messages.empty():
                batch.append(messages.get_nowait())
            done = batch[-1] is _DONE
            if done:
                batch.pop()
            if batch:
                yield batch
            if done:
                break
        error = task.exception()
        if error is not None and not complete:
            raise error
        if error is not None:
            logger.error("the app raised after its response", exc_info=error)
    finally:
        ended.set()
        if not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), APP_EXIT_GRACE_S)
            except BaseException:  # noqa: BLE001 - timed out, cancelled, or the app raised
                task.cancel()
