"""Stored Responses (``store: true``): a bounded in-memory store, as vLLM keeps them.

A ``StoredResponse`` holds a response's builder (the response object as it grows), the
conversation it ran on (for a later request's ``previous_response_id``) and, for a background
response, its task and the events it produced (``GET /v1/responses/{id}?stream=true`` replays
them, then follows the live ones). ``ResponseStore`` keeps at most ``size`` responses and
forgets a finished one ``ttl`` seconds after it finished (0: never); the oldest finished ones
go first when it is full. A running background response is never evicted (admission bounds
them). The store lives on the event loop: nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator, Callable


class StoredResponse:
    """One stored response.

    Args:
        builder: the response's ``ResponseBuilder`` (``response()`` is the object clients get).
        messages: the chat messages it ran on, without its ``instructions``.
        background: created with ``background: true``.
    """

    def __init__(self, builder, messages: list[dict], background: bool = False):
        self.id = builder.id
        self.builder = builder  # until it ends; then only its response object is kept
        self.messages = messages
        self.background = background
        self.events: list[bytes] = []  # a background response's events, by sequence number
        self.task: asyncio.Task | None = None
        self.finished_at: float | None = None
        self._response: dict | None = None
        self._grew = asyncio.Event()
        if not background:
            self._end()

    @property
    def running(self) -> bool:
        return self.finished_at is None

    @property
    def status(self) -> str:
        return self.response()["status"]

    def response(self) -> dict:
        return self._response if self._response is not None else self.builder.response()

    def _end(self) -> None:
        """It has ended: the response object is all that is kept of its builder (the request
        it ran, its prompt's tokens, its parsers go)."""
        self._response = self.builder.response()
        self.builder = None
        self.finished_at = time.monotonic()

    def conversation(self, as_messages: Callable[[list[dict]], list[dict]]) -> list[dict]:
        """The messages a request continuing this response starts from: the ones it ran on,
        then its output items (``as_messages`` reads them as input items)."""
        return self.messages + as_messages(self.response()["output"])

    # -- a background response ---------------------------------------------------------------
    def run(self, events: AsyncIterator[bytes], on_end: Callable[[], None]) -> None:
        """Starts the background task producing ``events``; ``on_end`` runs when it ends, however
        it ends (a task cancelled before it started included)."""
        self.task = asyncio.get_running_loop().create_task(self._produce(events))
        self.task.add_done_callback(lambda task: self._ended(task, on_end))

    async def _produce(self, events: AsyncIterator[bytes]) -> None:
        try:
            async for event in events:
                self.events.append(event)
                self._wake()
        finally:
            await events.aclose()

    def _ended(self, task: asyncio.Task, on_end: Callable[[], None]) -> None:
        if task.cancelled():
            self.builder.cancel()
        elif task.exception() is not None:  # a bug: the response fails, the server goes on
            self.builder.fail("server_error", f"the response failed: {task.exception()!r}")
        self._end()
        self._wake()
        on_end()

    def _wake(self) -> None:
        self._grew.set()
        self._grew = asyncio.Event()

    async def cancel(self) -> None:
        """Cancels a running background response and waits until it has stopped."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def replay(self, starting_after: int = -1) -> AsyncIterator[bytes]:
        """Its events after sequence number ``starting_after``, then the live ones until it
        ends."""
        index = max(starting_after + 1, 0)
        while True:
            while index < len(self.events):
                yield self.events[index]
                index += 1
            if not self.running:
                return
            await self._grew.wait()


class ResponseStore:
    """At most ``size`` stored responses (0: none are), each finished one kept ``ttl`` seconds
    (0: until evicted by newer ones)."""

    def __init__(self, size: int, ttl: float):
        self.size = size
        self.ttl = ttl
        self._entries: collections.OrderedDict[str, StoredResponse] = collections.OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.size > 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, entry: StoredResponse) -> None:
        self._entries[entry.id] = entry
        self._entries.move_to_end(entry.id)
        self._evict()

    def get(self, response_id: str) -> StoredResponse | None:
        self._evict()
        return self._entries.get(response_id)

    def pop(self, response_id: str) -> StoredResponse | None:
        return self._entries.pop(response_id, None)

    def _evict(self) -> None:
        now = time.monotonic()
        finished = [entry for entry in self._entries.values() if not entry.running]
        excess = len(self._entries) - self.size
        for entry in finished:  # oldest first
            expired = self.ttl > 0 and now - entry.finished_at > self.ttl
            if expired or excess > 0:
                del self._entries[entry.id]
                excess -= 1
