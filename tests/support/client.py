"""A test's side of a live server's REST API and socket: a session, a post, the demo model's long answer,
and a client that stops reading (the stream, resume and slow-client tests of tests/streams/ and tests/api/).
"""

from __future__ import annotations

import socket

import httpx

from tests.support.server import LiveServer

# `[long]` makes the demo model answer with ~400 tokens: at 5 ms a token, a turn of about two seconds.
LONG = "[long] tell me everything"

# A client that reads nothing, with fixed socket buffers (no autotuning): with asyncio's 64 KB write buffer
# it holds about 130 KB before the server's sends stop and its queue (QUEUE frames) starts to fill.
# Two turns of BULKY (below) are ~800 frames, far past the buffers and QUEUE; a client that does read may lag
# QUEUE frames (half a second of the demo's 2 ms tokens) before it is cut off too, which a loaded machine
# (load 10 on 2 cores) reached with 64 in CI.
QUEUE = 256
SOCKET_BUFFER = 16 * 1024
# A user_message event repeats the text: two turns of these are far more than the buffers hold.
BULKY = LONG + " " + "x" * 90_000


def stalling_client(server: LiveServer) -> httpx.AsyncClient:
    """A client whose connections have a small fixed receive buffer: one that stops reading stalls soon."""
    options = [(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)]
    transport = httpx.AsyncHTTPTransport(socket_options=options)
    return httpx.AsyncClient(base_url=server.base_url, timeout=30, transport=transport)


def resume_reading(stalled: httpx.Response) -> None:
    """Opens a stalled stream's receive window wide before it reads again: a window far below loopback's
    64 KB segments makes TCP crawl."""
    sock = stalled.extensions["network_stream"].get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)


async def new_session(client: httpx.AsyncClient) -> str:
    response = await client.post("/v1/sessions", json={})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def post(client: httpx.AsyncClient, session_id: str, content: str) -> dict[str, object]:
    response = await client.post(f"/v1/sessions/{session_id}/messages", json={"content": content})
    assert response.status_code == 202, response.text
    body: dict[str, object] = response.json()
    return body
