"""`python -m app` listens on a socket with TCP keepalive, and the connections it accepts inherit it: an
idle `?wait=true` request or event stream is probed, so a client that vanished is noticed."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
import uvicorn

from app.__main__ import KEEPALIVE, listening_socket
from tests.test_launcher import _env, launched

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux keepalive options")

TCP_STATES_ESTABLISHED = "01"
TIMER_KEEPALIVE = "02"


@linux_only
def test_an_accepted_connection_inherits_the_keepalive_options() -> None:
    config = uvicorn.Config("app.main:app", host="127.0.0.1", port=0)
    with listening_socket(config) as listener:
        listener.listen()
        with socket.create_connection(listener.getsockname()[:2], timeout=10) as client:
            accepted, _ = listener.accept()
            with accepted:
                assert client.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
                assert accepted.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                for name, value in KEEPALIVE.items():
                    assert accepted.getsockopt(socket.IPPROTO_TCP, getattr(socket, name)) == value, name


def _timer(local_port: int, remote_port: int) -> str | None:
    """The kernel's timer of the established TCP connection local_port -> remote_port (/proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, state, timer = fields[1], fields[2], fields[3], fields[5]
        if (
            int(local.split(":")[1], 16) == local_port
            and int(remote.split(":")[1], 16) == remote_port
            and state == TCP_STATES_ESTABLISHED
        ):
            return timer.split(":")[0]
    return None


@linux_only
@pytest.mark.slow
@pytest.mark.processes
def test_the_launched_server_probes_an_idle_connection(database_url: str, tmp_path: Path) -> None:
    if not Path("/proc/net/tcp").exists():
        pytest.skip("no /proc/net/tcp")
    with (
        launched(_env(database_url), "127.0.0.1", tmp_path / "keepalive.log") as url,
        socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=10) as client,
    ):
        # One request, answered, and the connection left open and idle: its server end has its
        # keepalive timer running (without SO_KEEPALIVE an idle connection has no timer at all).
        client.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert client.recv(4096).startswith(b"HTTP/1.1 200")
        server_port, client_port = client.getpeername()[1], client.getsockname()[1]
        assert _timer(client_port, server_port) == "00"  # the client's end: no keepalive
        assert _timer(server_port, client_port) == TIMER_KEEPALIVE
