"""Session metadata and titles over a real socket, on SQLite and PostgreSQL: set at creation and by PATCH,
returned with the session, filtered in the list by exact match; refused whole when out of bounds; a title
from the first message of a session created without one."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.chat.sessions import TITLE_CHARS, first_line_title
from app.settings import Settings
from tests.fakes.script import Script
from tests.fakes.upstream import FakeUpstream
from tests.support.server import LiveServer, live_server

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


async def _ids(client: httpx.AsyncClient, **params: Any) -> list[str]:
    response = await client.get("/v1/sessions", params=params)
    assert response.status_code == 200, response.text
    return [s["id"] for s in response.json()["sessions"]]


async def test_metadata_is_kept_returned_and_filters_the_list(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:

        async def create(metadata: dict[str, Any] | None) -> str:
            body = {} if metadata is None else {"metadata": metadata}
            response = await client.post("/v1/sessions", json=body)
            assert response.status_code == 201, response.text
            assert response.json()["metadata"] == (metadata or {})
            sid: str = response.json()["id"]
            return sid

        apollo = await create({"project": "apollo", "rank": 3, "pinned": True, "score": 0.5})
        gemini = await create({"project": "gemini", "rank": 3, "pinned": False})
        plain = await create(None)
        newest_first = [plain, gemini, apollo]
        assert await _ids(client) == newest_first
        assert await _ids(client, **{"metadata.project": "apollo"}) == [apollo]
        assert await _ids(client, **{"metadata.rank": "3"}) == [gemini, apollo]
        assert await _ids(client, **{"metadata.rank": "3", "metadata.pinned": "true"}) == [apollo]
        assert await _ids(client, **{"metadata.pinned": "false"}) == [gemini]
        assert await _ids(client, **{"metadata.score": "0.5"}) == [apollo]
        assert await _ids(client, **{"metadata.project": "APOLLO"}) == []
        assert await _ids(client, **{"metadata.nothing": "apollo"}) == []
        # Two values for one key: no session holds both.
        both = await client.get("/v1/sessions?metadata.project=apollo&metadata.project=gemini")
        assert both.json()["sessions"] == []
        # Pages of a filtered list.
        first = (await client.get("/v1/sessions", params={"metadata.rank": "3", "limit": 1})).json()
        assert [s["id"] for s in first["sessions"]] == [gemini]
        rest = await client.get(
            "/v1/sessions", params={"metadata.rank": "3", "limit": 1, "cursor": first["next_cursor"]}
        )
        assert [s["id"] for s in rest.json()["sessions"]] == [apollo]

        # PATCH replaces the metadata whole; null empties it; the filter follows.
        patched = await client.patch(f"/v1/sessions/{gemini}", json={"metadata": {"project": "apollo"}})
        assert patched.status_code == 200 and patched.json()["metadata"] == {"project": "apollo"}
        assert await _ids(client, **{"metadata.project": "apollo"}) == [gemini, apollo]
        assert await _ids(client, **{"metadata.rank": "3"}) == [apollo]
        assert (await client.get(f"/v1/sessions/{gemini}")).json()["metadata"] == {"project": "apollo"}
        emptied = await client.patch(f"/v1/sessions/{apollo}", json={"metadata": None})
        assert emptied.json()["metadata"] == {}
        assert await _ids(client, **{"metadata.project": "apollo"}) == [gemini]
        # Another PATCH leaves the metadata as it was.
        await client.patch(f"/v1/sessions/{gemini}", json={"title": "renamed"})
        assert (await client.get(f"/v1/sessions/{gemini}")).json()["metadata"] == {"project": "apollo"}
        # A deleted session leaves no filter rows behind.
        assert (await client.delete(f"/v1/sessions/{gemini}")).status_code == 204
        assert await _ids(client, **{"metadata.project": "apollo"}) == []


@pytest.mark.parametrize(
    "metadata",
    [
        [1, 2],
        {"list": [1]},
        {"nested": {"a": 1}},
        {"null": None},
        {"bad key": "x"},
        {"": "x"},
        {f"k{n}": n for n in range(17)},
        {"long": "x" * 193},
        {"k" * 65: 1},
    ],
)
async def test_metadata_out_of_bounds_is_422_and_stores_nothing(server: LiveServer, metadata: Any) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={"metadata": {"keep": "me"}})).json()["id"]
        created = await client.post("/v1/sessions", json={"metadata": metadata})
        assert created.status_code == 422, created.text
        patched = await client.patch(f"/v1/sessions/{sid}", json={"metadata": metadata})
        assert patched.status_code == 422, patched.text
        assert await _ids(client) == [sid]
        assert (await client.get(f"/v1/sessions/{sid}")).json()["metadata"] == {"keep": "me"}


async def test_sixteen_keys_of_the_longest_values_fit(server: LiveServer) -> None:
    biggest = {f"{n:02d}" + "k" * 62: "v" * 192 for n in range(16)}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        created = await client.post("/v1/sessions", json={"metadata": biggest})
        assert created.status_code == 201, created.text
        assert created.json()["metadata"] == biggest


async def test_a_session_without_a_title_takes_its_first_messages_first_line(server: LiveServer) -> None:
    long_line = "word " * 40
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        untitled = (await client.post("/v1/sessions", json={})).json()["id"]
        titled = (await client.post("/v1/sessions", json={"title": "mine"})).json()["id"]
        for sid in (untitled, titled):
            posted = await client.post(
                f"/v1/sessions/{sid}/messages?wait=true", json={"content": f"\n  {long_line}\nsecond line"}
            )
            assert posted.status_code == 200, posted.text
        session = (await client.get(f"/v1/sessions/{untitled}")).json()
        assert session["title"] == first_line_title(long_line)
        assert len(session["title"]) == TITLE_CHARS and session["title"].endswith("\u2026")
        listed = {s["id"]: s["title"] for s in (await client.get("/v1/sessions")).json()["sessions"]}
        assert listed == {untitled: session["title"], titled: "mine"}


def test_first_line_titles() -> None:
    assert first_line_title("hello\nworld") == "hello"
    assert first_line_title("   \n\t  spaced out  \n") == "spaced out"
    assert first_line_title("x" * TITLE_CHARS) == "x" * TITLE_CHARS
    assert first_line_title("x" * (TITLE_CHARS + 1)) == "x" * (TITLE_CHARS - 1) + "\u2026"


@pytest.fixture
def titler() -> Iterator[FakeUpstream]:
    with FakeUpstream(api_key="sk-title") as running:
        yield running


async def test_a_title_model_replaces_the_first_line_unless_the_title_changed(
    settings: Settings, titler: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PARLEY_TITLE_MODEL writes the title of an untitled session from its first message (the first line
    stands meanwhile); a failing title model leaves the first line; a titled session asks nothing."""
    monkeypatch.setenv("PARLEY_TEST_TITLE_KEY", "sk-title")
    models = tmp_path / "models.json"
    provider = {
        "api_base": titler.base_url,
        "api_key_env": "PARLEY_TEST_TITLE_KEY",
        "models": ["openai/titler"],
    }
    models.write_text(json.dumps({"providers": {"fake": provider}}))
    configured = settings.model_copy(update={"models_file": models, "title_model": "openai/titler"})
    titler.enqueue(Script.text('"Weather in Paris"'), Script.error(500))
    with live_server(configured) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:

            async def ask(sid: str, content: str) -> None:
                posted = await client.post(
                    f"/v1/sessions/{sid}/messages?wait=true", json={"content": content}
                )
                assert posted.status_code == 200, posted.text

            async def title_of(sid: str, want: str) -> None:
                for _ in range(200):
                    if (await client.get(f"/v1/sessions/{sid}")).json()["title"] == want:
                        return
                    await asyncio.sleep(0.05)
                raise AssertionError(f"{sid}: the title never became {want!r}")

            named = (await client.post("/v1/sessions", json={})).json()["id"]
            await ask(named, "what's the weather like in Paris today?\nI'm packing")
            await title_of(named, "Weather in Paris")
            prompt = titler.requests[0].body["messages"]
            assert prompt[-1] == {
                "role": "user",
                "content": "what's the weather like in Paris today?\nI'm packing",
            }

            failed = (await client.post("/v1/sessions", json={})).json()["id"]
            await ask(failed, "hello there")
            for _ in range(200):
                if len(titler.requests) == 2:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # the refused title's write, had there been one
            assert (await client.get(f"/v1/sessions/{failed}")).json()["title"] == "hello there"

            titled = (await client.post("/v1/sessions", json={"title": "mine"})).json()["id"]
            await ask(titled, "hello again")
            assert (await client.get(f"/v1/sessions/{titled}")).json()["title"] == "mine"
            assert len(titler.requests) == 2
