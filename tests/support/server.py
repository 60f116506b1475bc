"""A real uvicorn server on a free port, in a background thread, for tests that need a socket."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn
from alembic import command
from alembic.config import Config

from app.main import create_app
from app.settings import Settings
from app.storage.engine import sync_url
from app.tools.registry import ToolRegistry

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def migrate(database_url: str) -> None:
    config = Config(str(ROOT / "alembic.ini"))
    config.attributes["url"] = sync_url(database_url)
    config.attributes["configure_logger"] = False
    command.upgrade(config, "head")


class _Server(uvicorn.Server):
    """uvicorn's server, stopped without its polls: its main loop checks for an exit every 0.1 s and its
    shutdown sleeps 0.1 s before it waits for connections, ~0.15 s of each test's teardown. `stop` wakes the
    loop at once, and the shutdown waits for what uvicorn waits for (connections closed, then tasks) in
    small steps. A real process keeps uvicorn's own (tests/test_launcher*.py, the replicas)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.wake = threading.Event()
        self._stop: asyncio.Event | None = None

    def stop_soon(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.should_exit = True
        if loop is not None and self._stop is not None:
            loop.call_soon_threadsafe(self._stop.set)

    async def main_loop(self) -> None:
        self._stop = asyncio.Event()
        counter = 0
        while not await self.on_tick(counter) and not self.should_exit:
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 0.1)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        deadline = (
            time.monotonic() + self.config.timeout_graceful_shutdown
            if self.config.timeout_graceful_shutdown
            else None
        )
        while self.server_state.connections or self.server_state.tasks:
            if deadline is not None and time.monotonic() > deadline:
                for task in self.server_state.tasks:
                    task.cancel()
                break
            await asyncio.sleep(0.005)
        for server in self.servers:
            await server.wait_closed()
        await self.lifespan.shutdown()


class LiveServer:
    def __init__(
        self, settings: Settings, tools: ToolRegistry | None = None, *, send_buffer: int | None = None
    ) -> None:
        """`send_buffer` caps every connection's kernel send buffer (SO_SNDBUF), so that a client that
        does not read blocks the server's sends after a few kilobytes instead of megabytes."""
        self.settings = settings
        self.port = free_port()
        self._socket: socket.socket | None = None
        if send_buffer is not None:
            # Accepted connections inherit the listening socket's buffer sizes.
            self._socket = socket.socket()
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
            self._socket.bind(("127.0.0.1", 0))
            self.port = int(self._socket.getsockname()[1])
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(settings, tools=tools)
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="on",
        )
        self.server = _Server(config)
        self._thread = threading.Thread(target=self._serve, name=f"uvicorn:{self.port}", daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None

    def _serve(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        try:
            sockets = [self._socket] if self._socket is not None else None
            self.loop.run_until_complete(self.server.serve(sockets=sockets))
        finally:
            # Libraries leave watcher tasks behind (sse-starlette's shutdown watcher): end them politely.
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.close()

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server thread died while starting")
            if time.monotonic() > deadline:
                raise TimeoutError("the server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.drain()
        self.server.stop_soon(self.loop)
        self._thread.join(timeout=30)

    def drain(self) -> None:
        """What SIGTERM starts in a real process: turns stop, the log is flushed, every stream ends.

        A thread gets no signal, and uvicorn would wait for open streams before the lifespan's own drain.
        """
        drain = getattr(self.app.state, "drain", None)
        if drain is not None and self.loop is not None and self.loop.is_running():
            asyncio.run_coroutine_threadsafe(drain.run(), self.loop).result(timeout=30)


@contextmanager
def live_server(
    settings: Settings, tools: ToolRegistry | None = None, *, send_buffer: int | None = None
) -> Iterator[LiveServer]:
    server = LiveServer(settings, tools, send_buffer=send_buffer)
    server.start()
    try:
        yield server
    finally:
        server.stop()
