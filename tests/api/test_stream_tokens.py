"""Stream tokens over a real socket: one session's event stream through `?access_token=`, nothing else, not
after expiry for a new connection, while a stream it opened goes on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import datetime

import httpx
import jwt
import pytest

from app.chat.stream_tokens import STREAM_TOKEN_TYPE, is_stream_token
from app.settings import Settings
from tests.support.server import LiveServer, live_server
from tests.support.sse import EventReader

pytestmark = pytest.mark.anyio

ALICE = "alice-key-0123456789abcdef"
BOB = "bob-key-0123456789abcdef00"
LIFETIME = 3.0


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def keyed(settings: Settings) -> Iterator[LiveServer]:
    configured = settings.model_copy(
        update={"api_keys": f"alice:{ALICE},bob:{BOB}", "stream_token_seconds": LIFETIME, "metrics": True}
    )
    with live_server(configured) as running:
        yield running


async def _token(client: httpx.AsyncClient, sid: str) -> str:
    response = await client.post(f"/v1/sessions/{sid}/stream_token", headers=bearer(ALICE))
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"token", "expires_at"}
    left = datetime.fromisoformat(body["expires_at"]).timestamp() - datetime.now().timestamp()
    assert 0 < left <= LIFETIME + 1
    token: str = body["token"]
    assert is_stream_token(token) and jwt.get_unverified_header(token)["typ"] == STREAM_TOKEN_TYPE
    return token


async def _refused(response: httpx.Response, reason: str | None = None) -> None:
    await response.aread()
    assert response.status_code == 401, response.text
    if reason is not None:
        assert response.json()["error"]["details"]["reason"] == reason, response.text


async def test_a_stream_token_opens_its_sessions_stream_and_nothing_else(keyed: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=keyed.base_url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={}, headers=bearer(ALICE))).json()["id"]
        other = (await client.post("/v1/sessions", json={}, headers=bearer(ALICE))).json()["id"]
        token = await _token(client, sid)
        # Its session's stream, with no other credential: a browser's EventSource.
        async with EventReader(client, f"/v1/sessions/{sid}/events?access_token={token}") as reader:
            posted = await client.post(
                f"/v1/sessions/{sid}/messages", json={"content": "hi"}, headers=bearer(ALICE)
            )
            assert posted.status_code == 202
            await reader.wait_type("turn_done")
        # Another session's stream, even the same owner's.
        async with client.stream("GET", f"/v1/sessions/{other}/events", params={"access_token": token}) as r:
            await _refused(r, "stream_token")
        # Any other route, as the header or in the query, and a POST.
        for method, path in [
            ("GET", "/v1/sessions"),
            ("GET", f"/v1/sessions/{sid}"),
            ("GET", f"/v1/sessions/{sid}/messages"),
            ("POST", f"/v1/sessions/{sid}/messages"),
            ("POST", f"/v1/sessions/{sid}/stream_token"),
        ]:
            body = {"content": "sneaky"} if method == "POST" else None
            as_header = await client.request(method, path, headers=bearer(token), json=body)
            await _refused(as_header, "stream_token")
            in_query = await client.request(method, path, params={"access_token": token}, json=body)
            await _refused(in_query)
        history = await client.get(f"/v1/sessions/{sid}/messages", headers=bearer(ALICE))
        assert "sneaky" not in history.text
        # A forged one (another secret) and bob, who does not own the session.
        forged = jwt.encode(
            {"sub": "alice", "sid": sid, "aud": "parley:stream", "exp": 2**31},
            "a-guess-at-the-secret-0123456789abcdef",
            algorithm="HS256",
            headers={"typ": STREAM_TOKEN_TYPE},
        )
        async with client.stream("GET", f"/v1/sessions/{sid}/events", params={"access_token": forged}) as r:
            await _refused(r, "signature")
        bob = await client.post(f"/v1/sessions/{sid}/stream_token", headers=bearer(BOB))
        assert bob.status_code == 404
        scrape = (await client.get("/metrics")).text
        assert 'parley_auth_failures_total{reason="stream_token"}' in scrape


async def test_an_expired_stream_token_opens_no_new_stream_while_the_open_one_goes_on(
    keyed: LiveServer,
) -> None:
    async with httpx.AsyncClient(base_url=keyed.base_url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={}, headers=bearer(ALICE))).json()["id"]
        token = await _token(client, sid)
        async with EventReader(client, f"/v1/sessions/{sid}/events?access_token={token}") as reader:
            expiry = jwt.decode(token, options={"verify_signature": False})["exp"]
            # The expiry under test: waited out (what is awaited is the clock passing it).
            await asyncio.sleep(max(0.0, expiry + 0.2 - datetime.now().timestamp()))
            async with client.stream(
                "GET", f"/v1/sessions/{sid}/events", params={"access_token": token}
            ) as r:
                await _refused(r, "expired")
            posted = await client.post(
                f"/v1/sessions/{sid}/messages", json={"content": "still there?"}, headers=bearer(ALICE)
            )
            assert posted.status_code == 202
            done = await reader.wait_type("turn_done")
            assert done[0].data["turn_id"] == posted.json()["turn_id"]
