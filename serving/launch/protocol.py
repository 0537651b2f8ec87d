"""uvicorn's HTTP/1.1 protocol (h11), hardened: a deadline on reading a request's headers, a
limit on their size, and no request smuggling.

- **Header deadline.** uvicorn times out only a connection that stays silent after a response:
  one that connects and sends nothing, or dribbles a request line a byte at a time, holds its
  socket forever (a slowloris). Here every connection must deliver complete headers within
  ``header_read_timeout`` seconds of connecting or of its previous response, or it is closed
  (with a 408 if it had sent part of a request). Body reads have their own deadline in the app
  (``read_body``).
- **Header size.** A request line and header fields over ``max_header_bytes`` get 431 (h11
  alone only bounds headers that arrive in pieces, and uvicorn answers those with a bare 400).
- **Smuggling.** A request with both ``Content-Length`` and ``Transfer-Encoding`` is framed one
  way by this server and may be framed the other way by a proxy in front of it; RFC 9112
  section 6.3 says to treat it as an error and close the connection. It gets 400, and nothing
  after it on the connection is read.

A refused connection is closed gracefully: the answer is written, the sending side shut, and
whatever the client still sends is read and dropped for up to ``LINGER_SECONDS`` (closing with
unread data would reset the connection, and the client could lose the answer).
"""

from __future__ import annotations

import asyncio
import http
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b'connection: close\r\ncontent-length: 44\r\n\r\n{"error": "request headers took too long"}\r\n'
)
LINGER_SECONDS = 2.0  # how long a refused connection's further input is read and dropped
BOTH_FRAMINGS = (
    "a request may not carry both Content-Length and Transfer-Encoding (RFC 9112 section 6.3); "
    "the connection is closed"
)


class GuardedConnection(h11.Connection):
    """h11's server side, refusing requests this server must not read: headers over
    ``max_header_bytes`` (431) and both framings at once (400). ``rejection`` is the status and
    message of the last refusal, for the answer."""

    def __init__(self, max_header_bytes: int):
        super().__init__(h11.SERVER, max_incomplete_event_size=max_header_bytes)
        self.max_header_bytes = max_header_bytes
        self.rejection: tuple[int, str] | None = None

    def next_event(self):
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as error:
            if error.error_status_hint == 431:  # h11: the headers outgrew the buffer
                self.rejection = (431, self.too_large())
            else:
                self.rejection = (error.error_status_hint, f"invalid HTTP request: {error}")
            raise
        if isinstance(event, h11.Request):
            problem = self.problem(event)
            if problem is not None:
                self.rejection = problem
                raise h11.RemoteProtocolError(problem[1], error_status_hint=problem[0])
        return event

    def problem(self, request: h11.Request) -> tuple[int, str] | None:
        """Why ``request`` must be refused (status, message), or None."""
        size = len(request.method) + len(request.target) + len(request.http_version) + 9
        size += sum(len(name) + len(value) + 4 for name, value in request.headers)
        if size > self.max_header_bytes:
            return 431, self.too_large()
        names = {name.lower() for name, _ in request.headers}
        if b"content-length" in names and b"transfer-encoding" in names:
            return 400, BOTH_FRAMINGS
        return None

    def too_large(self) -> str:
        return (
            f"the request line and headers exceed {self.max_header_bytes} bytes "
            "(--max-header-bytes)"
        )


def hardened_protocol(header_read_timeout: float, max_header_bytes: int) -> type[H11Protocol]:
    """An ``H11Protocol`` class (for ``uvicorn.Config(http=...)``) with that header deadline
    and header size limit, refusing smuggling-prone requests."""

    class HardenedProtocol(H11Protocol):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.conn = GuardedConnection(max_header_bytes)
            self._dropping = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._partial = False
            self._header_timer: asyncio.TimerHandle | None = None
            self._arm_header_timer()

        def data_received(self, data: bytes) -> None:
            if self._dropping:  # refused: the client's remaining input is read and dropped
                return
            self._partial = self._partial or bool(data)
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # the headers are in
                self._cancel_header_timer()

        def send_400_response(self, msg: str) -> None:
            """Answers a request h11 or ``GuardedConnection`` refused (400, 431...) with a JSON
            body, then closes the connection gracefully."""
            status, message = self.conn.rejection or (400, msg)
            self.conn.rejection = None
            body = json.dumps({"error": message, "error_type": "validation"}).encode()
            headers = [
                (b"content-type", b"application/json"),
                (b"connection", b"close"),
                (b"content-length", str(len(body)).encode()),
            ]
            reason = http.HTTPStatus(status).phrase.encode()
            response = h11.Response(status_code=status, headers=headers, reason=reason)
            try:
                output = self.conn.send(response) + self.conn.send(h11.Data(data=body))
                output += self.conn.send(h11.EndOfMessage())
            except h11.LocalProtocolError:  # h11 cannot answer in its state: write it by hand
                head = b"HTTP/1.1 %d %s\r\n" % (status, reason)
                head += b"".join(name + b": " + value + b"\r\n" for name, value in headers)
                output = head + b"\r\n" + body
            self.transport.write(output)
            self._close_gracefully()

        def _close_gracefully(self) -> None:
            self._dropping = True
            self._cancel_header_timer()
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.transport.resume_reading()
            self.loop.call_later(LINGER_SECONDS, self.transport.close)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._partial = bool(self.conn.trailing_data[0])  # a pipelined request begun
                self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_header_timer()
            super().connection_lost(exc)

        def _arm_header_timer(self) -> None:
            self._cancel_header_timer()
            self._header_timer = self.loop.call_later(header_read_timeout, self._headers_late)

        def _cancel_header_timer(self) -> None:
            timer = getattr(self, "_header_timer", None)
            if timer is not None:
                timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if self._partial:
                self.transport.write(REQUEST_TIMEOUT)
            self.transport.close()

    return HardenedProtocol
