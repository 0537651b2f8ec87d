"""The HTTP ingress in front of the engine replicas: reads each request's body, names its prompt
(``routing_text``) and forwards it to a replica the router picks, streaming the replica's
response back.

A replica that dies before its response started is retried on another (``attempts`` in all);
after the last, the client gets 503 with jaxgen's error body. Once the response has started the
request cannot be replayed: the connection is cut, as a single server dying would cut it. A
client that leaves cancels the forwarded call (the replica aborts the engine request). Bodies
over ``max_body_bytes`` get 413 and bodies slower than ``body_read_timeout`` 408, before any
replica is involved.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from serving.ray_routing.replica_bridge import ForwardedRequest
from serving.ray_routing.routing_text import routing_text

logger = logging.getLogger("serving")


class ReplicaStream(Protocol):
    """A forwarded call in flight (Ray's ``DeploymentResponseGenerator``)."""

    def __aiter__(self) -> AsyncIterator[list[dict]]: ...

    def cancel(self) -> None: ...


class BodyError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


OPENAI_TYPES = {500: "server_error", 503: "service_unavailable"}
TGI_TYPES = {408: "timeout", 500: "internal", 503: "unavailable"}


def error_body(path: str, status: int, message: str) -> dict:
    """jaxgen's error body for ``status``: OpenAI's shape under ``/v1``, else TGI's."""
    if path.startswith("/v1"):
        kind = OPENAI_TYPES.get(status, "invalid_request_error")
        return {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return {"error": message, "error_type": TGI_TYPES.get(status, "validation")}


class ForwardingIngress:
    """The ingress ASGI app.

    Args:
        forward: starts a forwarded call on a replica the router picks.
        retriable: the exceptions that mean the replica died (the call may go elsewhere).
        max_body_bytes: the largest body read (the server's ``--max-body-bytes``).
        body_read_timeout: seconds a body may take to arrive.
        attempts: replicas tried for one request before 503.
    """

    def __init__(
        self,
        forward: Callable[[ForwardedRequest], ReplicaStream],
        *,
        retriable: tuple[type[BaseException], ...],
        max_body_bytes: int,
        body_read_timeout: float,
        attempts: int = 2,
    ):
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self.forward = forward
        self.retriable = retriable
        self.max_body_bytes = max_body_bytes
        self.body_read_timeout = body_read_timeout
        self.attempts = attempts

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets: jaxgen serves none
        path = scope.get("path", "")
        try:
            body = await asyncio.wait_for(self._read_body(scope, receive), self.body_read_timeout)
        except BodyError as error:
            await _respond(send, error.status, error_body(path, error.status, str(error)))
            return
        except asyncio.TimeoutError:
            message = f"the request body took over {self.body_read_timeout:g} s to arrive"
            await _respond(send, 408, error_body(path, 408, message), close=True)
            return
        if body is None:
            return  # the client left while sending it
        request = ForwardedRequest.from_scope(scope, body, routing_text(path, body))
        watcher = asyncio.ensure_future(_wait_for_disconnect(receive))
        try:
            await self._forward(request, send, watcher)
        finally:
            watcher.cancel()

    async def _read_body(self, scope, receive) -> bytes | None:
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body_bytes:
                raise BodyError(413, f"request body exceeds {self.max_body_bytes} bytes")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise BodyError(413, f"request body exceeds {self.max_body_bytes} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _forward(self, request: ForwardedRequest, send, watcher: asyncio.Future) -> None:
        path = request.scope.get("path", "")
        for attempt in range(1, self.attempts + 1):
            started, stream = False, None
            try:
                stream = self.forward(request)
                async for batch in _until(stream, watcher):
                    for message in batch:
                        started = started or message["type"] == "http.response.start"
                        await send(message)
                return
            except self.retriable as error:
                if started:
                    raise  # the response is under way: cut it (the client sees it end early)
                logger.warning("replica died under %s (try %d): %s", path, attempt, error)
            except Exception:  # noqa: BLE001 - any other failure before the response: a 500
                if started:
                    raise
                logger.exception("forwarding %s failed", path)
                body = error_body(path, 500, "internal server error")
                await _respond(send, 500, body)
                return
            finally:
                if stream is not None:  # a no-op once it finished; else stops the replica's work
                    stream.cancel()
        message = f"no replica could serve the request ({self.attempts} tried)"
        await _respond(send, 503, error_body(path, 503, message))


async def _until(stream: ReplicaStream, watcher: asyncio.Future) -> AsyncIterator[list[dict]]:
    """``stream``'s batches until it ends, or until the client disconnects (then it stops)."""
    iterator = stream.__aiter__()
    while True:
        step = asyncio.ensure_future(iterator.__anext__())
        await asyncio.wait({step, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not step.done():  # the client left
            step.cancel()
            await asyncio.gather(step, return_exceptions=True)
            return
        try:
            batch = step.result()
        except StopAsyncIteration:
            return
        yield batch


async def _wait_for_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _lifespan(receive, send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _respond(send, status: int, body: dict, *, close: bool = False) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
