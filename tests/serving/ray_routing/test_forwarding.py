"""The ingress's forwarding (``forwarding_ingress.py``) and the replica's side of it
(``replica_bridge.py``), in one process without Ray: a Starlette app stands in for jaxgen's, and
streams stand in for Ray's handle calls (one whose replica "dies")."""

from __future__ import annotations

import asyncio
import json
import pickle

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from serving.ray_routing.forwarding_ingress import ForwardingIngress
from serving.ray_routing.replica_bridge import ForwardedRequest, serve_forwarded


class ReplicaDied(Exception):
    """Stands in for Ray's ``RayActorError``."""


def make_app(events: list):
    async def echo(request: Request):
        body = await request.json()
        return JSONResponse({"got": body, "path": request.url.path})

    async def stream(request: Request):
        async def tokens():
            try:
                for i in range(1000):
                    yield f"data: {i}\n\n"
                    await asyncio.sleep(0.01)
            finally:
                events.append("stream ended")

        return StreamingResponse(tokens(), media_type="text/event-stream")

    async def boom(request: Request):
        raise RuntimeError("app bug")

    routes = [
        Route("/v1/completions", echo, methods=["POST"]),
        Route("/generate_stream", stream, methods=["POST"]),
        Route("/boom", boom, methods=["POST"]),
    ]
    return Starlette(routes=routes)


class LocalStream:
    """A forwarded call served in this process (what Ray's generator does across processes)."""

    def __init__(self, app, request: ForwardedRequest, calls: list):
        pickle.loads(pickle.dumps(request))  # what Ray ships must pickle
        calls.append(request)
        self.batches = serve_forwarded(app, request)
        self.cancelled = False

    def __aiter__(self):
        return self.batches

    def cancel(self) -> None:
        self.cancelled = True
        asyncio.ensure_future(self.batches.aclose())


class ScriptedStream:
    """Yields ``batches``, then raises ``error`` (if any)."""

    def __init__(self, batches: list, error: BaseException | None = None):
        self.batches, self.error, self.cancelled = batches, error, False

    async def _run(self):
        for batch in self.batches:
            yield batch
        if self.error is not None:
            raise self.error

    def __aiter__(self):
        return self._run()

    def cancel(self) -> None:
        self.cancelled = True


def scope(path: str, body: bytes = b"", headers=()) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), *headers],
        "client": ("127.0.0.1", 1234),
        "server": ("127.0.0.1", 8000),
        "state": {"not": object()},  # scope entries that do not pickle stay behind
    }


async def call(app, http_scope: dict, chunks: list[bytes], *, leave_after: float | None = None):
    """Runs ASGI ``app`` on a request sent in ``chunks``; the client disconnects
    ``leave_after`` seconds after the body (None: never). Returns the messages sent."""
    pending = list(chunks)
    sent: list[dict] = []

    async def receive():
        if pending:
            chunk = pending.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(pending)}
        if leave_after is None:
            await asyncio.Event().wait()
        await asyncio.sleep(leave_after)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await app(http_scope, receive, send)
    return sent


def response(sent: list[dict]) -> tuple[int, bytes]:
    (start,) = [m for m in sent if m["type"] == "http.response.start"]
    return start["status"], b"".join(m.get("body", b"") for m in sent[1:])


def ingress(forward, **kwargs) -> ForwardingIngress:
    options = dict(retriable=(ReplicaDied,), max_body_bytes=1000, body_read_timeout=5.0)
    return ForwardingIngress(forward, **{**options, **kwargs})


def test_a_request_is_forwarded_with_its_body_and_prompt_text():
    app, calls = make_app([]), []
    front = ingress(lambda request: LocalStream(app, request, calls))
    body = {"model": "m", "prompt": "Once upon a time"}
    data = json.dumps(body).encode()
    sent = asyncio.run(call(front, scope("/v1/completions"), [data[:10], data[10:]]))
    status, payload = response(sent)
    assert status == 200 and json.loads(payload) == {"got": body, "path": "/v1/completions"}
    (forwarded,) = calls
    assert forwarded.body == data and forwarded.routing.text.endswith("Once upon a time")
    assert "state" not in forwarded.scope and forwarded.scope["path"] == "/v1/completions"


def test_a_replica_dying_before_the_response_is_retried_on_another():
    app, calls, streams = make_app([]), [], []

    def forward(request):
        if not streams:
            streams.append(ScriptedStream([], ReplicaDied("actor died")))
        else:
            streams.append(LocalStream(app, request, calls))
        return streams[-1]

    sent = asyncio.run(call(ingress(forward), scope("/v1/completions"), [b'{"prompt": "x"}']))
    assert response(sent)[0] == 200
    assert len(streams) == 2 and streams[0].cancelled


def test_every_replica_dying_is_a_503_with_the_error_body():
    def forward(request):
        return ScriptedStream([], ReplicaDied("actor died"))

    sent = asyncio.run(call(ingress(forward), scope("/v1/completions"), [b"{}"]))
    status, payload = response(sent)
    error = json.loads(payload)["error"]
    assert status == 503 and error["type"] == "service_unavailable" and error["code"] == 503
    sent = asyncio.run(call(ingress(forward, attempts=1), scope("/generate"), [b"{}"]))
    status, payload = response(sent)
    assert status == 503 and json.loads(payload)["error_type"] == "unavailable"  # TGI's shape


def test_a_replica_dying_mid_response_cuts_it():
    start = {"type": "http.response.start", "status": 200, "headers": []}
    chunk = {"type": "http.response.body", "body": b"data: 0\n\n", "more_body": True}
    stream = ScriptedStream([[start, chunk]], ReplicaDied("actor died"))
    with pytest.raises(ReplicaDied):
        asyncio.run(call(ingress(lambda r: stream), scope("/generate_stream"), [b"{}"]))
    assert stream.cancelled


def test_any_other_failure_before_the_response_is_a_500():
    stream = ScriptedStream([], RuntimeError("the replica's app raised"))
    sent = asyncio.run(call(ingress(lambda r: stream), scope("/generate"), [b"{}"]))
    status, payload = response(sent)
    assert status == 500 and json.loads(payload)["error_type"] == "internal"


def test_an_app_raising_after_its_500_ends_the_call_normally():
    app = make_app([])  # Starlette answers 500, then re-raises (uvicorn would log it)
    sent = asyncio.run(call(ingress(lambda r: LocalStream(app, r, [])), scope("/boom"), [b"{}"]))
    assert response(sent)[0] == 500


def test_an_app_raising_before_any_response_raises_in_the_bridge():
    async def broken(scope, receive, send):
        raise RuntimeError("broken app")

    async def drain():
        request = ForwardedRequest.from_scope(scope("/generate"), b"{}")
        return [batch async for batch in serve_forwarded(broken, request)]

    with pytest.raises(RuntimeError, match="broken app"):
        asyncio.run(drain())


def test_oversized_and_slow_bodies_are_refused_before_any_replica():
    def forward(request):
        raise AssertionError("no replica should be called")

    declared = scope("/v1/completions", headers=[(b"content-length", b"5000")])
    status, payload = response(asyncio.run(call(ingress(forward), declared, [b"{}"])))
    assert status == 413 and "exceeds 1000 bytes" in json.loads(payload)["error"]["message"]
    streamed = [b"x" * 600, b"x" * 600]
    status, _ = response(asyncio.run(call(ingress(forward), scope("/generate"), streamed)))
    assert status == 413

    async def slow():
        front = ingress(forward, body_read_timeout=0.05)
        sent: list = []

        async def receive():
            await asyncio.sleep(1)
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(message):
            sent.append(message)

        await front(scope("/generate"), receive, send)
        return sent

    status, payload = response(asyncio.run(slow()))
    assert status == 408 and json.loads(payload)["error_type"] == "timeout"


def test_a_client_leaving_mid_stream_stops_the_replica_app():
    events: list = []
    app, streams = make_app(events), []

    def forward(request):
        streams.append(LocalStream(app, request, []))
        return streams[-1]

    async def run():
        sent = await call(ingress(forward), scope("/generate_stream"), [b"{}"], leave_after=0.2)
        await asyncio.sleep(0.2)  # the cancelled call winds down
        return sent

    sent = asyncio.run(run())
    status, payload = response(sent)
    assert status == 200 and payload.startswith(b"data: 0\n\n")
    assert payload.count(b"data:") < 1000  # stopped early
    assert streams[0].cancelled and events == ["stream ended"]


def test_the_bridge_reports_a_disconnect_once_the_call_ends():
    events: list = []
    app = make_app(events)
    request = ForwardedRequest.from_scope(scope("/generate_stream"), b"{}")

    async def first_batches():
        batches = serve_forwarded(app, request)
        received = [await batches.__anext__() for _ in range(3)]
        await batches.aclose()  # the ingress stopped reading: the app sees http.disconnect
        return received

    received = asyncio.run(first_batches())
    assert received[0][0]["type"] == "http.response.start"
    assert events == ["stream ended"]


def test_the_ingress_answers_the_lifespan_protocol():
    messages = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list = []

    async def receive():
        return messages.pop(0)

    async def send(message):
        sent.append(message["type"])

    asyncio.run(ingress(lambda r: None)({"type": "lifespan"}, receive, send))
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    with pytest.raises(ValueError, match="attempts"):
        ingress(lambda r: None, attempts=0)
