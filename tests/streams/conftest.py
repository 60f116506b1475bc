"""Streams that never lose an event: shared fixtures and helpers of the resume, fan-out and crash tests."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest

from app.settings import Settings
from tests.support.server import LiveServer, live_server

# `[long]` makes the demo model answer with ~400 tokens: at 5 ms a token, a turn of about two seconds.
LONG = "[long] tell me everything"

# A client that reads nothing, with fixed socket buffers (no autotuning): with asyncio's 64 KB write buffer
# it holds about 130 KB before the server's sends stop and its queue (QUEUE frames) starts to fill.
QUEUE = 64
SOCKET_BUFFER = 16 * 1024
# A user_message event repeats the text: two turns of these are far more than the buffers hold.
BULKY = LONG + " " + "x" * 90_000


@pytest.fixture
def paced(settings: Settings) -> Iterator[LiveServer]:
    with live_server(settings.model_copy(update={"demo_token_delay": 0.005})) as running:
        yield running


@pytest.fixture
def small_queues(settings: Settings) -> Iterator[LiveServer]:
    """Small send buffers and subscriber queues: a client that reads nothing soon fills them."""
    tuned = settings.model_copy(update={"demo_token_delay": 0.002, "subscriber_queue_size": QUEUE})
    with live_server(tuned, send_buffer=SOCKET_BUFFER) as running:
        yield running


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
