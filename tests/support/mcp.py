"""The test MCP server (tests/tools/mcp_server.py, written with the SDK's MCPServer) as a real process.

`McpHttpServer` runs it over streamable HTTP on a free port (kill it, start it again on the same port);
`stdio_config` is the tools-file entry that has Parley start it over stdio. Both log what the server saw
to a file (`seen()`), such as a cancelled call.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from app.tools.config import McpServerConfig
from tests.support.server import ROOT, free_port

SERVER = ROOT / "tests" / "tools" / "mcp_server.py"


def seen(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def alive(pid: int) -> bool:
    """Whether a process with this pid exists and is not a zombie (checked in /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def wait_for(condition: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def stdio_config(log: Path, **options: object) -> McpServerConfig:
    return McpServerConfig.model_validate(
        {
            "command": sys.executable,
            "args": [str(SERVER), "stdio"],
            "env": {"MCP_TEST_LOG": str(log)},
            **options,
        }
    )


class McpHttpServer:
    def __init__(self, log: Path) -> None:
        self.log = log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.process: subprocess.Popen[bytes] | None = None

    def config(self, **options: object) -> McpServerConfig:
        return McpServerConfig.model_validate({"url": self.url, **options})

    def start(self) -> None:
        env = {**os.environ, "MCP_TEST_LOG": str(self.log)}
        self.process = subprocess.Popen(
            [sys.executable, str(SERVER), "http", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the MCP test server did not start") from None
                time.sleep(0.05)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None
