"""PostgreSQL going away and coming back, with a real server on a real socket: its connections go through
a TCP proxy that the test cuts (tests/support/tcp_proxy.py), as a database restart or a network failure
would cut them.

While the database is out of reach requests get 503 `storage_unavailable` with Retry-After and /readyz says
not ready; once it is back the same server answers again, without a restart. A turn that was streaming
when the connection went ends `failed` with an error event once the database is back, and every message
acknowledged (202) before the cut is in the history afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy.engine import make_url

from app.settings import Settings
from tests.support.client import LONG, new_session, post
from tests.support.postgres import ScratchDatabase
from tests.support.server import LiveServer, live_server
from tests.support.stream import StreamClient, assert_contiguous
from tests.support.tcp_proxy import TcpProxy, tcp_proxy

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def proxy(postgres_database: ScratchDatabase) -> Iterator[TcpProxy]:
    url = make_url(postgres_database.url)
    with tcp_proxy(url.host or "127.0.0.1", url.port or 5432) as running:
        yield running


@pytest.fixture
def server(postgres_database: ScratchDatabase, proxy: TcpProxy) -> Iterator[LiveServer]:
    url = make_url(postgres_database.url).set(host="127.0.0.1", port=proxy.port)
    settings = Settings(
        database_url=url.render_as_string(hide_password=False),
        demo_token_delay=0.01,
        provider_retry_backoff=0.01,
        database_pool_timeout=2,
    )
    with live_server(settings) as running:
        yield running


async def test_requests_get_503_while_the_database_is_away_and_answer_once_it_is_back(
    server: LiveServer, proxy: TcpProxy
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = await new_session(client)
        proxy.cut()
        for answer in (
            await client.get(f"/v1/sessions/{sid}/messages"),
            await client.post("/v1/sessions", json={}),
            await client.post(f"/v1/sessions/{sid}/messages", json={"content": "lost?"}),
        ):
            assert answer.status_code == 503, answer.text
            assert answer.headers["retry-after"] == "2"
            assert answer.json()["error"]["code"] == "storage_unavailable"
        ready = await client.get("/readyz")
        assert (ready.status_code, ready.json()["database_ready"]) == (503, False)

        proxy.restore()  # the same server, not restarted
        assert (await client.get("/readyz")).status_code == 200
        assert (await client.get(f"/v1/sessions/{sid}/messages")).status_code == 200
        assert (await client.post("/v1/sessions", json={})).status_code == 201
        listed = (await client.get("/v1/sessions")).json()["sessions"]
        history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
    # What was refused was not stored: one session before the cut, one after; no message.
    assert len(listed) == 2
    assert history == []


async def test_an_outage_between_requests_costs_no_request_once_the_database_is_back(
    server: LiveServer, proxy: TcpProxy
) -> None:
    """Cut and restored while no request runs: every pooled connection died meanwhile, yet the first
    requests afterwards all answer, because the pool replaces a dead connection at checkout (it looks
    at the socket; there is no ping per transaction). Reads and writes, several at once so that more than
    one dead connection is met, and the history holds exactly what was posted."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sids = await asyncio.gather(*(new_session(client) for _ in range(4)))
        proxy.cut()
        await asyncio.sleep(0.2)
        proxy.restore()
        pages = await asyncio.gather(*(client.get(f"/v1/sessions/{sid}/messages") for sid in sids))
        assert [page.status_code for page in pages] == [200] * 4, [page.text for page in pages]
        posted = await asyncio.gather(
            *(client.post(f"/v1/sessions/{sid}/messages", json={"content": "hi"}) for sid in sids)
        )
        assert [answer.status_code for answer in posted] == [202] * 4, [a.text for a in posted]
        assert (await client.get("/readyz")).status_code == 200
        histories = [
            (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"] for sid in sids
        ]
    for history, answer in zip(histories, posted, strict=True):
        users = [m["id"] for m in history if m["type"] == "text" and m.get("role") == "user"]
        assert users == [answer.json()["id"]]


async def test_a_turn_streaming_when_the_connection_goes_ends_failed_once_it_is_back(
    server: LiveServer, proxy: TcpProxy
) -> None:
    """The cut outlasts the answer, so the turn's own write at its end fails; the turn waits for the
    database, then ends failed with an error event. The message acknowledged (202) before the cut is
    answered afterwards: nothing acknowledged is lost, and the stream has no gap and no duplicate."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = await new_session(client)
        watch = StreamClient(client, sid)
        opened = asyncio.Event()
        reading = asyncio.create_task(watch.read(watch.turns_done(2), seconds=90, opened=opened))
        await opened.wait()
        first = await post(client, sid, LONG)
        waiting = await client.post(
            f"/v1/sessions/{sid}/messages", json={"content": "and then?", "delivery": "queue"}
        )
        assert waiting.status_code == 202 and waiting.json()["queued"] is True
        await watch.wait(lambda frames: sum(f.event == "text_delta" for f in frames) >= 20)
        proxy.cut()
        # The answer (~400 tokens, 10 ms each) ends while the database is away.
        await asyncio.sleep(6)
        assert (await client.get("/readyz")).status_code == 503
        proxy.restore()
        assert await reading == "matched"
        history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]

    assert_contiguous(watch.frames)
    ends = [f.payload for f in watch.frames if f.event in ("error", "turn_done")]
    assert [(e["type"], e.get("code") or e.get("status")) for e in ends] == [
        ("error", "storage_unavailable"),
        ("turn_done", "failed"),
        ("turn_done", "completed"),
    ]
    assert ends[1]["turn_id"] == first["turn_id"]
    markers = [(m["type"], m.get("status") or m.get("code")) for m in history if m["type"] != "text"]
    assert markers == [
        ("turn_start", None),
        ("error", "storage_unavailable"),
        ("turn_done", "failed"),
        ("turn_start", None),
        ("turn_done", "completed"),
    ]
    users = [m["id"] for m in history if m["type"] == "text" and m.get("role") == "user"]
    assert users == [first["id"], waiting.json()["id"]]
