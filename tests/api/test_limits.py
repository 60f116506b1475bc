"""Per-principal limits over a real socket: message rate and open streams, 429 with Retry-After."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from app.chat.limits import STREAM_RETRY_AFTER
from app.settings import Settings
from tests.support.server import LiveServer, live_server
from tests.support.sse import EventReader

pytestmark = pytest.mark.anyio

ALICE = "alice-key-0123456789abcdef"
BOB = "bob-key-0123456789abcdef00"


@pytest.fixture
def limited(settings: Settings) -> Iterator[LiveServer]:
    tuned = settings.model_copy(
        update={
            "api_keys": f"alice:{ALICE},bob:{BOB}",
            "messages_per_minute": 2,
            "max_streams_per_principal": 2,
        }
    )
    with live_server(tuned) as running:
        yield running


def client(server: LiveServer, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server.base_url, timeout=30, headers={"Authorization": f"Bearer {key}"})


async def _user_messages(client: httpx.AsyncClient, sid: str) -> int:
    """Once every turn has ended (a waiting message moves from the queue into the history)."""
    for _ in range(400):
        session = (await client.get(f"/v1/sessions/{sid}")).json()
        waiting = (await client.get(f"/v1/sessions/{sid}/queue")).json()["queue"]
        if session["agent_status"] == "idle" and not waiting:
            break
        await asyncio.sleep(0.05)
    history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
    return len([m for m in history if m["type"] == "text" and m["role"] == "user"])


async def test_posting_faster_than_the_rate_gets_429_and_stores_nothing(limited: LiveServer) -> None:
    async with client(limited, ALICE) as alice, client(limited, BOB) as bob:
        sid = (await alice.post("/v1/sessions", json={})).json()["id"]
        for n in range(2):
            posted = await alice.post(f"/v1/sessions/{sid}/messages", json={"content": f"m{n}"})
            assert posted.status_code == 202, posted.text
        refused = await alice.post(f"/v1/sessions/{sid}/messages", json={"content": "one too many"})
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "30"  # two a minute: one more in 30 s
        error = refused.json()["error"]
        assert (error["code"], error["details"]) == ("rate_limited", {"retry_after": 30})
        assert error["request_id"] == refused.headers["x-request-id"]
        assert await _user_messages(alice, sid) == 2

        # Reading is not limited, and bob has an allowance of his own.
        assert (await alice.get(f"/v1/sessions/{sid}")).status_code == 200
        other = (await bob.post("/v1/sessions", json={})).json()["id"]
        assert (await bob.post(f"/v1/sessions/{other}/messages", json={"content": "hi"})).status_code == 202


async def test_one_stream_more_than_allowed_gets_429_until_one_closes(limited: LiveServer) -> None:
    async with client(limited, ALICE) as alice, client(limited, BOB) as bob:
        sid = (await alice.post("/v1/sessions", json={})).json()["id"]
        url = f"/v1/sessions/{sid}/events"
        first = EventReader(alice, url)
        await first.__aenter__()
        try:
            async with EventReader(alice, url):
                refused = await alice.get(url)
                assert refused.status_code == 429
                assert refused.headers["retry-after"] == str(STREAM_RETRY_AFTER)
                assert refused.json()["error"]["code"] == "too_many_streams"
                # bob's streams are counted apart (his own session)
                mine = (await bob.post("/v1/sessions", json={})).json()["id"]
                async with EventReader(bob, f"/v1/sessions/{mine}/events"):
                    pass
        finally:
            await first.__aexit__(None, None, None)
        # Both closed: the slots come back once the server has seen the clients leave.
        for _ in range(100):
            async with alice.stream("GET", url) as again:
                if again.status_code == 200:
                    break
            await asyncio.sleep(0.05)
        assert again.status_code == 200


async def test_refused_streams_and_unknown_sessions_hold_no_slot(limited: LiveServer) -> None:
    async with client(limited, ALICE) as alice:
        sid = (await alice.post("/v1/sessions", json={})).json()["id"]
        for _ in range(5):
            assert (await alice.get("/v1/sessions/s_nope/events")).status_code == 404
            assert (await alice.get(f"/v1/sessions/{sid}/events", params={"after": "x"})).status_code == 422
        url = f"/v1/sessions/{sid}/events"
        async with EventReader(alice, url), EventReader(alice, url):
            pass
