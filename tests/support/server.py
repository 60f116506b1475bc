"""A real uvicorn server on a free port, in a background thread, for tests that need a socket."""

from __future__ import annotations

import asyncio
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
from app.tools.registry import ToolRegistry

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def migrate(database_url: str) -> None:
    config = Config(str(ROOT / "alembic.ini"))
    config.attributes["url"] = database_url.replace("+aiosqlite", "")
    config.attributes["configure_logger"] = False
    command.upgrade(config, "head")


class LiveServer:
    def __init__(self, settings: Settings, tools: ToolRegistry | None = None) -> None:
        self.settings = settings
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            create_app(settings, tools=tools),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="on",
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, name=f"uvicorn:{self.port}", daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None

    def _serve(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.server.serve())
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
        self.server.should_exit = True
        self._thread.join(timeout=30)


@contextmanager
def live_server(settings: Settings, tools: ToolRegistry | None = None) -> Iterator[LiveServer]:
    server = LiveServer(settings, tools)
    server.start()
    try:
        yield server
    finally:
        server.stop()
