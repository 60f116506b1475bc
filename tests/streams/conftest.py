"""Streams that never lose an event: shared fixtures and helpers of the resume, fan-out and crash tests."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from app.settings import Settings
from tests.support.server import LiveServer, live_server

# `[long]` makes the demo model answer with ~400 tokens: at 5 ms a token, a turn of about two seconds.
LONG = "[long] tell me everything"


@pytest.fixture
def paced(settings: Settings) -> Iterator[LiveServer]:
    with live_server(settings.model_copy(update={"demo_token_delay": 0.005})) as running:
        yield running


async def new_session(client: httpx.AsyncClient) -> str:
    response = await client.post("/v1/sessions", json={})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def post(client: httpx.AsyncClient, session_id: str, content: str) -> dict[str, object]:
    response = await client.post(f"/v1/sessions/{session_id}/messages", json={"content": content})
    assert response.status_code == 202, response.text
    body: dict[str, object] = response.json()
    return body
