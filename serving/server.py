"""Running the app under uvicorn: a draining server for the CLI, a background thread for tests."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import uvicorn


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first SIGTERM/SIGINT drains before shutting down.

    While draining, ``/health`` and new requests get 503; in-flight requests finish, or are
    aborted once ``drain_timeout`` passes. Then uvicorn shuts down and the process exits 0. A
    second signal exits at once.
    """

    def __init__(self, config: uvicorn.Config, state, drain_timeout: float):
        super().__init__(config)
        self.state = state
        self.drain_timeout = drain_timeout
        self.exit_code = 0
        self.draining = False
        self._drain_task: asyncio.Task | None = None

    def handle_exit(self, sig, frame) -> None:
        # Not recorded in uvicorn's captured signals, so they are not re-raised at exit.
        if self.draining:
            self.force_exit = True
            self.should_exit = True
            return
        self.draining = True
        loop = getattr(self.state, "loop", None)
        if loop is None or loop.is_closed():
            self.should_exit = True
            return
        loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        try:
            await self.state.drain(self.drain_timeout)
        finally:
            self.should_exit = True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class ServerThread:
    """Serves an app on a loopback port from a background thread (tests, notebooks).

    ``with ServerThread(app) as server: httpx.get(server.url + "/health")``
    """

    def __init__(
        self, app, host: str = "127.0.0.1", port: int | None = None, log_level: str = "warning"
    ):
        self.host = host
        self.port = port or free_port(host)
        config = uvicorn.Config(
            app,
            host=host,
            port=self.port,
            log_level=log_level,
            lifespan="on",
            access_log=False,
            timeout_graceful_shutdown=5,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
