"""Server-sent events and client-disconnect handling for generation responses."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

logger = logging.getLogger("serving")

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class ClientDisconnected(Exception):
    """The client went away before its response was ready."""


def sse_event(data: Any) -> bytes:
    """One ``data:`` event; ``data`` is JSON-encoded unless it is already a string."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n".encode()


async def wait_for_disconnect(receive) -> None:
    """Returns once the client disconnects (call after the request body was read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def run_until_disconnect(receive, work: Awaitable[Any]) -> Any:
    """Awaits ``work``; if the client disconnects first, cancels it and raises
    ``ClientDisconnected`` (the engine request is aborted by the cancellation)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finished = task.done()
    finally:
        task.cancel()
        watcher.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
    if not finished:
        raise ClientDisconnected()
    return task.result()


class EventStreamResponse:
    """An ASGI ``text/event-stream`` response that stops (and aborts generation) when the client
    disconnects, and always calls ``on_close`` (to release the admission slot) exactly once.

    Args:
        events: yields encoded events (``bytes``).
        on_close: called when the response ends for any reason.
        headers: extra response headers.
    """

    def __init__(
        self,
        events: AsyncIterator[bytes],
        on_close: Callable[[], None],
        headers: dict[str, str] | None = None,
    ):
        self.events = events
        self.on_close = on_close
        self.headers = {**SSE_HEADERS, **(headers or {})}

    async def __call__(self, scope, receive, send) -> None:
        producer = watcher = None
        try:
            headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
            headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            producer = asyncio.ensure_future(self._produce(send))
            watcher = asyncio.ensure_future(wait_for_disconnect(receive))
            await asyncio.wait({producer, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if producer.done() and not producer.cancelled() and producer.exception() is None:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            for task in (producer, watcher):
                if task is not None and not task.done():
                    task.cancel()
            tasks = [t for t in (producer, watcher) if t is not None]
            results = await asyncio.gather(*tasks, return_exceptions=True)
            try:
                await self.events.aclose()
            finally:
                self.on_close()
            for result in results:
                if isinstance(result, Exception) and not isinstance(result, OSError):
                    logger.error("event stream failed", exc_info=result)

    async def _produce(self, send) -> None:
        async for event in self.events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
