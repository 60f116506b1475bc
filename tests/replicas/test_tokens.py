"""Bearer JWTs and stream tokens across two real replica processes: a user's token works on either, a
stream token one replica issued opens the stream on the other (the signing secret every replica reads
from the shared database), and another user sees nothing on either."""

from __future__ import annotations

import time

import httpx
import jwt
import pytest

from tests.replicas.conftest import Replicas, clients
from tests.support.sse import EventReader

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SECRET = "replicas-jwt-secret-0123456789abcdef0123456"


def token(sub: str) -> dict[str, str]:
    signed = jwt.encode({"sub": sub, "exp": int(time.time()) + 600}, SECRET, algorithm="HS256")
    return {"Authorization": f"Bearer {signed}"}


async def test_a_token_and_a_stream_token_work_on_either_replica(replicas: Replicas) -> None:
    a_server, b_server = await replicas(2, PARLEY_JWT_SECRET=SECRET)
    async with clients(a_server, b_server) as (a, b):
        created = await a.post(
            "/v1/sessions", json={"metadata": {"project": "apollo"}}, headers=token("alice")
        )
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        on_b = await b.get("/v1/sessions", params={"metadata.project": "apollo"}, headers=token("alice"))
        assert [s["id"] for s in on_b.json()["sessions"]] == [sid]
        for client in (a, b):
            assert (await client.get(f"/v1/sessions/{sid}", headers=token("bob"))).status_code == 404
            assert (await client.get("/v1/sessions", headers=token("bob"))).json()["sessions"] == []

        issued = await a.post(f"/v1/sessions/{sid}/stream_token", headers=token("alice"))
        assert issued.status_code == 200, issued.text
        stream_token = issued.json()["token"]
        async with httpx.AsyncClient(base_url=b_server.base_url, timeout=60) as browser:
            url = f"/v1/sessions/{sid}/events?access_token={stream_token}"
            async with EventReader(browser, url) as reader:
                posted = await a.post(
                    f"/v1/sessions/{sid}/messages", json={"content": "hi"}, headers=token("alice")
                )
                assert posted.status_code == 202, posted.text
                await reader.wait_type("turn_done", timeout=60)
            refused = await browser.get(f"/v1/sessions/{sid}/messages", params={"access_token": stream_token})
            assert refused.status_code == 401
