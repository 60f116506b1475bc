"""MCP servers that never finish the handshake, through a real Parley process: a stdio server that prints
a line that is not JSON-RPC, one that prints nothing (both start a child and sleep), and an HTTP server
that accepts the connection and never answers `initialize`. Each is `error` in GET /v1/tools after the
connect timeout; after Parley's SIGTERM no process they started is left (checked in /proc).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from app.settings import Settings
from tests.support.mcp import alive, seen
from tests.support.process import ServerProcess

pytestmark = [pytest.mark.slow, pytest.mark.processes]
SCRIPT = Path(__file__).with_name("hung_mcp_server.py")


def started_by(log: Path) -> list[int]:
    """Every process whose environment names this test's log: the stdio servers and their children."""
    needle = f"HUNG_LOG={log}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0") and alive(int(entry.name)):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def test_a_server_that_never_finishes_the_handshake_is_an_error_and_leaves_no_process(
    settings: Settings, tmp_path: Path
) -> None:
    log = tmp_path / "hung.log"
    silent_http = socket.socket()  # listens, never accepts: the request is sent and never answered
    silent_http.bind(("127.0.0.1", 0))
    silent_http.listen(16)
    port = silent_http.getsockname()[1]
    stdio = {"command": sys.executable, "env": {"HUNG_LOG": str(log)}}
    tools = tmp_path / "tools.yaml"
    tools.write_text(
        yaml.safe_dump(
            {
                "mcp_servers": {
                    "garbage": {**stdio, "args": [str(SCRIPT), "garbage"]},
                    "silent": {**stdio, "args": [str(SCRIPT)]},
                    "mute": {"url": f"http://127.0.0.1:{port}/mcp"},
                }
            }
        )
    )
    env = {
        "PARLEY_DATABASE_URL": settings.database_url,
        "PARLEY_TOOLS_FILE": str(tools),
        "PARLEY_MCP_CONNECT_TIMEOUT": "2",
        "PARLEY_MCP_RETRY_MAX": "0.5",
    }
    parley = ServerProcess(env, tmp_path / "server.log")
    parley.start(timeout=120)
    try:
        states: dict[str, tuple[str, str | None]] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            listing = httpx.get(f"{parley.base_url}/v1/tools", timeout=5).json()
            states = {s["name"]: (s["state"], s["error"]) for s in listing["mcp_servers"]}
            if all(state == "error" for state, _ in states.values()):
                break
            time.sleep(0.1)
        assert all(state == "error" for state, _ in states.values()), states
        assert all("no answer to the handshake within 2 s" in str(error) for _, error in states.values())
        # SIGTERM while the servers are being tried again: wait for a new start whose process is alive.
        starts = len([line for line in seen(log) if line.startswith("start")])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            fresh = [line for line in seen(log) if line.startswith("start")][starts:]
            if fresh and alive(int(fresh[-1].split()[1])):
                break
            time.sleep(0.05)
        assert started_by(log), "no stdio server is running before the SIGTERM"
        assert parley.process is not None
        parley.process.send_signal(signal.SIGTERM)
        try:
            parley.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no stop within 60 s of the SIGTERM; the server log:\n{parley.log()[-8000:]}")
    finally:
        parley.kill()
        silent_http.close()
    assert started_by(log) == [], "a stdio MCP server or its child outlived Parley"
    assert not any(alive(int(line.split()[1])) for line in seen(log))
