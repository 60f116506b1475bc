"""Liveness and readiness over a real socket: a started server answers /healthz, the history and the event
stream while the model layer still loads (its read of LiteLLM's model map held back by the test), /readyz
says 503 until the load ends and 200 after it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from app.llm import gateway
from app.llm.litellm_tables import ModelMap
from app.settings import Settings
from tests.support.server import live_server
from tests.support.sse import EventReader

pytestmark = pytest.mark.anyio


class HeldImport:
    """Stands in for the model layer's load (`gateway._read_model_layer`, in its worker thread): the load
    begins, then waits until the test releases it."""

    def __init__(self) -> None:
        self.begun = threading.Event()
        self.released = threading.Event()
        self._real = gateway._read_model_layer

    def __call__(self) -> ModelMap:
        self.begun.set()
        self.released.wait(timeout=60)
        return self._real()


@pytest.fixture
def finished_session(settings: Settings) -> str:
    """A session with one completed turn, written by an earlier server (whose model layer loaded)."""
    with live_server(settings) as server, httpx.Client(base_url=server.base_url, timeout=30) as client:
        sid = str(client.post("/v1/sessions", json={}).json()["id"])
        done = client.post(f"/v1/sessions/{sid}/messages", params={"wait": "true"}, json={"content": "hi"})
        assert done.json()["status"] == "completed", done.text
    return sid


@pytest.fixture
def held(finished_session: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldImport]:
    """Held for the servers started from here on (after the finished session's)."""
    held = HeldImport()
    monkeypatch.setattr(gateway, "_read_model_layer", held)
    try:
        yield held
    finally:
        held.released.set()


async def test_health_history_and_streams_answer_while_the_model_layer_loads(
    settings: Settings, finished_session: str, held: HeldImport
) -> None:
    sid = finished_session
    with live_server(settings) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            # The load has begun and cannot end before the test releases it.
            assert held.begun.wait(timeout=30)
            health = await client.get("/healthz")
            assert (health.status_code, health.json()) == (200, {"status": "ok", "models_ready": False})
            ready = await client.get("/readyz")
            assert (ready.status_code, ready.json()) == (
                503,
                {"status": "loading", "models_ready": False, "database_ready": True},
            )

            history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
            assert history[0]["type"] == "turn_start"
            assert any(m.get("role") == "user" and m.get("content") == "hi" for m in history)
            async with EventReader(client, f"/v1/sessions/{sid}/events?after=0") as reader:
                await reader.wait_type("turn_done")
            assert (await client.get("/readyz")).status_code == 503  # all of it while still loading

            held.released.set()
            deadline = time.monotonic() + 60
            while (ready := await client.get("/readyz")).status_code != 200:
                assert ready.status_code == 503, ready.text
                assert time.monotonic() < deadline, "the model layer never finished loading"
                await asyncio.sleep(0.02)
            assert ready.json() == {"status": "ok", "models_ready": True, "database_ready": True}
            assert (await client.get("/healthz")).json() == {"status": "ok", "models_ready": True}
