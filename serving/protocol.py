"""uvicorn's HTTP/1.1 protocol with a deadline on reading a request's headers.

uvicorn times out only a connection that stays silent after a response: one that connects and
sends nothing, or dribbles a request line a byte at a time, holds its socket forever (a
slowloris). Here every connection must deliver complete headers within ``header_read_timeout``
seconds of connecting or of its previous response, or it is closed (with a 408 if it had sent
part of a request). Body reads have their own deadline in the app (``read_json_object``).
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b'connection: close\r\ncontent-length: 44\r\n\r\n{"error": "request headers took too long"}\r\n'
)


def header_deadline_protocol(header_read_timeout: float) -> type[H11Protocol]:
    """An ``H11Protocol`` class (for ``uvicorn.Config(http=...)``) with that header deadline."""

    class HeaderDeadlineProtocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._partial = False
            self._header_timer: asyncio.TimerHandle | None = None
            self._arm_header_timer()

        def data_received(self, data: bytes) -> None:
            self._partial = self._partial or bool(data)
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # the headers are in
                self._cancel_header_timer()

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
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if self._partial:
                self.transport.write(REQUEST_TIMEOUT)
            self.transport.close()

    return HeaderDeadlineProtocol
