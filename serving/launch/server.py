"""Running the app under uvicorn: a draining server for the CLI, a background thread for tests."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import uvicorn

from serving.launch.protocol import hardened_protocol
from serving.settings.resolve import ServerSettings


def uvicorn_config(app, settings: ServerSettings, *, host: str, port: int, log_level: str):
    """uvicorn's config for the app: the connection cap, keep-alive, header deadline and size."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        access_log=False,
        timeout_graceful_shutdown=5,
        http=hardened_protocol(settings.header_read_timeout, settings.max_header_bytes),
        limit_concurrency=settings.max_connections,
        timeout_keep_alive=settings.keep_alive_timeout,
    )


def exit_code(state) -> int:
    """The process's exit code once serving ends: 1 if the model failed to load or the engine
    died (a supervisor should restart the server), else 0."""
    llm = state.llm
    if state.load_error is not None or getattr(llm, "dead", None) is not None:
        return 1
    return 0


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first SIGTERM/SIGINT drains before shutting down.

    While draining, ``/health`` and new requests get 503; in-flight requests finish, or are
    aborted once ``drain_timeout`` passes. Then uvicorn shuts down and the process exits 0. A
    second signal exits at once. An engine that dies is drained the same way, and the process
    then exits 1.
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

    async def on_tick(self, counter: int) -> bool:
        if not self.draining and getattr(self.state.llm, "dead", None) is not None:
            self.draining = True
            self._start_drain()
        return await super().on_tick(counter)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        try:
            await self.state.drain(self.drain_timeout)
        finally:
            self.exit_code = max(self.exit_code, exit_code(self.state))
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
        state = getattr(app.state, "server", None)
        settings = state.settings if state is not None else ServerSettings()
        config = uvicorn_config(app, settings, host=host, port=self.port, log_level=log_level)
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
