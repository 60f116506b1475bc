"""The event stream's ends, over a real socket: a client cut for reading nothing, one that leaves, one that
leaves without reading a byte each give back the stream's subscription and its stream slot."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import httpx
import pytest

from app.api import events as events_api
from app.api.deps import Services
from app.chat.auth import OPEN_PRINCIPAL
from app.settings import Settings
from app.streaming.broker import Broker
from tests.support.client import BULKY, SOCKET_BUFFER, new_session, post, resume_reading, stalling_client
from tests.support.server import LiveServer, live_server

pytestmark = pytest.mark.anyio

SAFETY = 30.0  # a net under waits that end on something the test causes; never a timing assertion

T = TypeVar("T")


def on_server(server: LiveServer, make: Callable[[Services], Coroutine[Any, Any, T]]) -> asyncio.Future[T]:
    """Runs a coroutine on the server's loop, with the services its lifespan built."""
    assert server.loop is not None
    services: Services = server.server.lifespan.state["services"]
    return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(make(services), server.loop))


async def held(server: LiveServer, session_id: str) -> tuple[int, int]:
    """The session's subscribers and the (keyless) principal's open streams, as the server counts them."""

    async def count(services: Services) -> tuple[int, int]:
        assert isinstance(services.broker, Broker)  # this process's fan-out, whose channels can be counted
        channel = await services.broker.channel(session_id)
        return len(channel.subscribers), await services.streams.open_count(OPEN_PRINCIPAL)

    return await on_server(server, count)


async def until_held(server: LiveServer, session_id: str, expected: tuple[int, int]) -> None:
    async with asyncio.timeout(SAFETY):
        while True:
            if await held(server, session_id) == expected:
                return
            await asyncio.sleep(0.02)


async def open_stream(client: httpx.AsyncClient, session_id: str) -> httpx.Response:
    request = client.build_request("GET", f"/v1/sessions/{session_id}/events")
    response = await client.send(request, stream=True)
    assert response.status_code == 200
    return response


@pytest.fixture
def stalled_server(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[LiveServer]:
    """Half a second of send timeout, and small socket buffers that a client reading nothing soon fills."""
    monkeypatch.setattr(events_api, "SEND_TIMEOUT", 0.5)
    tuned = settings.model_copy(update={"demo_token_delay": 0.002})
    with live_server(tuned, send_buffer=SOCKET_BUFFER) as running:
        yield running


async def test_a_client_that_reads_nothing_is_cut_after_the_send_timeout_and_gives_its_stream_back(
    stalled_server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    server = stalled_server
    caplog.set_level(logging.WARNING)
    # uvicorn's loggers do not propagate to the root, where caplog listens: its errors must show too.
    uvicorn_log = logging.getLogger("uvicorn")
    uvicorn_log.addHandler(caplog.handler)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as client:
        sid = await new_session(client)
        async with stalling_client(server) as slow:
            stalled = await open_stream(slow, sid)
            try:
                assert await held(server, sid) == (1, 1)
                await post(client, sid, BULKY)  # one event far larger than the socket buffers
                await until_held(server, sid, (0, 0))
                # Only now does it read: what the buffers held, then a connection closed mid-body.
                resume_reading(stalled)
                with pytest.raises(httpx.RemoteProtocolError):
                    await asyncio.wait_for(stalled.aread(), SAFETY)
            finally:
                await stalled.aclose()
                uvicorn_log.removeHandler(caplog.handler)

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "app.api.sse"]
    assert [r.getMessage() for r in warnings] == [
        "an event stream was cut: its client read nothing for 0.5 s"
    ]
    # Not raised as a server error (no "Exception in ASGI application" and its traceback). uvicorn still
    # says that the response was left unfinished: ASGI has no other way to have it close the connection.
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == ["ASGI callable returned without completing response."]


async def test_a_client_that_leaves_gives_its_stream_back(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as client:
        sid = await new_session(client)
        staying = await open_stream(client, sid)
        leaving = await open_stream(client, sid)
        assert await held(server, sid) == (2, 2)
        await leaving.aclose()
        await until_held(server, sid, (1, 1))  # the other stream keeps its own
        await staying.aclose()
        await until_held(server, sid, (0, 0))


async def test_a_client_that_leaves_without_reading_a_byte_gives_its_stream_back(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as client:
        sid = await new_session(client)
    request = f"GET /v1/sessions/{sid}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(request)
        await until_held(server, sid, (1, 1))
    await until_held(server, sid, (0, 0))


async def test_head_opens_no_stream(server: LiveServer) -> None:
    """The route serves GET only (FastAPI adds no HEAD): a HEAD is refused before anything is held. Were it
    served, the response would answer the headers alone and give the stream back (see test_sse.py)."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as client:
        sid = await new_session(client)
        response = await client.head(f"/v1/sessions/{sid}/events")
        assert response.status_code == 405
        assert await held(server, sid) == (0, 0)
