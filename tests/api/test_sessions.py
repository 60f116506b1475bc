"""Session CRUD, the model list, and refusals that store nothing."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.support.server import LiveServer

pytestmark = pytest.mark.anyio


async def _count(client: httpx.AsyncClient) -> int:
    return len((await client.get("/v1/sessions", params={"limit": 200})).json()["sessions"])


async def test_create_read_update_list_delete(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        created = await client.post(
            "/v1/sessions", json={"title": "t", "system_prompt": "Be brief.", "tools": ["calculate"]}
        )
        assert created.status_code == 201
        session = created.json()
        assert session["tools"] == ["calculate"]
        assert session["context_window"] == 32768
        assert session["created_at"] == session["updated_at"]
        sid = session["id"]
        assert (await client.get(f"/v1/sessions/{sid}")).json() == session

        patched = await client.patch(f"/v1/sessions/{sid}", json={"title": "renamed"})
        assert patched.status_code == 200
        assert patched.json()["title"] == "renamed"
        assert patched.json()["updated_at"] >= session["updated_at"]

        bad_model = await client.patch(f"/v1/sessions/{sid}", json={"model": "no-such-model-xyz"})
        assert bad_model.status_code == 422
        assert bad_model.json()["error"]["code"] == "unknown_model"
        assert "GET /v1/models" in bad_model.json()["error"]["message"]
        assert (await client.get(f"/v1/sessions/{sid}")).json()["model"] == "parley/demo"

        assert (await client.delete(f"/v1/sessions/{sid}")).status_code == 204
        missing = await client.get(f"/v1/sessions/{sid}")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"
        assert (await client.get(f"/v1/sessions/{sid}/messages")).status_code == 404
        assert (await client.post(f"/v1/sessions/{sid}/messages", json={"content": "x"})).status_code == 404


async def test_list_is_paginated_newest_first(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        ids = [(await client.post("/v1/sessions", json={"title": str(i)})).json()["id"] for i in range(5)]
        seen: list[str] = []
        cursor = None
        while True:
            params: dict[str, str | int] = {"limit": 2}
            if cursor:
                params["cursor"] = cursor
            page = (await client.get("/v1/sessions", params=params)).json()
            seen += [s["id"] for s in page["sessions"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == list(reversed(ids))
        bad = await client.get("/v1/sessions", params={"cursor": "not-a-cursor!"})
        assert bad.status_code == 422


@pytest.mark.parametrize(
    "body",
    [
        {"model": "no-such-model-xyz"},
        {"tools": ["current_time", "rm_rf"]},
        {"unexpected": 1},
        {"title": 5},
    ],
)
async def test_refused_creations_store_nothing(server: LiveServer, body: dict[str, object]) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        before = await _count(client)
        response = await client.post("/v1/sessions", json=body)
        assert response.status_code in (400, 422)
        error = response.json()["error"]
        assert error["code"] in ("unknown_model", "unknown_tool", "validation_error")
        assert error["message"]
        assert await _count(client) == before


async def test_refused_messages_store_nothing(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
        for body in (
            {"content": ""},
            {"content": " \n "},
            {"text": "hi"},
            {"content": "hi", "extra": 1},
        ):
            response = await client.post(f"/v1/sessions/{sid}/messages", json=body)
            assert response.status_code == 422, body
            assert response.json()["error"]["details"]
        assert (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"] == []


async def test_models_lists_the_demo_with_its_window(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        listed = (await client.get("/v1/models")).json()
        assert listed["default_model"] == "parley/demo"
        demo = next(m for m in listed["models"] if m["model"] == "parley/demo")
        assert demo["context_window"] == 32768
        assert (await client.get("/healthz")).json()["status"] == "ok"
        # The demo's window needs no model map; ready follows once it is read (~50 ms, in a thread).
        deadline = asyncio.get_running_loop().time() + 30  # a bound against hanging, not a timing
        while (await client.get("/readyz")).status_code != 200:
            assert asyncio.get_running_loop().time() < deadline, "never ready"
            await asyncio.sleep(0.02)
