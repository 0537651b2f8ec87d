"""ASGI middleware around every route: ``X-Request-Id`` and the API key.

``RequestIdMiddleware`` takes the client's ``X-Request-Id`` (or makes one), keeps it in
``request.state.request_id`` (the OpenAI routes use it as the response id) and returns it on every
response; a response whose structured-output grammar leaves JSON Schema keywords unenforced
(``request.state.relaxed_keywords``, ``jaxgen.structured_outputs.relaxations``) also carries
``X-Structured-Output-Relaxed: <keyword>, ...``. ``ApiKeyMiddleware`` refuses a request without ``Authorization: Bearer <key>`` with 401
and OpenAI's error body, except on the open paths (health and metrics) and CORS preflights.
"""

from __future__ import annotations

import json
import re
import secrets
import uuid

OPEN_PATHS = ("/health", "/ping", "/metrics")
_REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,256}$")  # printable ASCII, no spaces
_NOT_PRINTABLE = re.compile(r"[^\x20-\x7e]")


class RequestIdMiddleware:
    """Honours ``X-Request-Id`` (printable ASCII up to 256 characters; else a new one)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = _header(scope, b"x-request-id")
        request_id = given if given and _REQUEST_ID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k != b"x-request-id"]
                headers.append((b"x-request-id", request_id.encode("ascii")))
                relaxed = scope["state"].get("relaxed_keywords")
                if relaxed:  # printable ASCII only: a format's name comes from the schema
                    value = _NOT_PRINTABLE.sub("?", ", ".join(relaxed))[:1000]
                    headers.append((b"x-structured-output-relaxed", value.encode("ascii")))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_id)


class ApiKeyMiddleware:
    """Requires ``Authorization: Bearer <api_key>`` outside ``OPEN_PATHS``."""

    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        given = (_header(scope, b"authorization") or "").encode()
        if secrets.compare_digest(given, self.expected):
            return await self.app(scope, receive, send)
        body = json.dumps(
            {
                "error": {
                    "message": "Incorrect or missing API key: send `Authorization: Bearer <key>`",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_api_key",
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None
