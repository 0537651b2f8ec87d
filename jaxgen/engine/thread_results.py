"""An awaitable that another thread settles: how ``AsyncLLM``'s engine thread hands results
back to the event loop."""

from __future__ import annotations

import asyncio


class concurrent_result:  # noqa: N801 - awaitable set from another thread
    """A future on ``loop`` that the engine thread resolves."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.future = loop.create_future()

    def set_result(self, value) -> None:
        self.loop.call_soon_threadsafe(_settle, self.future, value, None)

    def set_exception(self, error: BaseException) -> None:
        self.loop.call_soon_threadsafe(_settle, self.future, None, error)

    def __await__(self):
        return self.future.__await__()


def _settle(future: asyncio.Future, value, error) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)
