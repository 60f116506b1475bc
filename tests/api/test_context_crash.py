"""kill -9 during summarisation (docs/context.md): a real server process whose turn waits on its summary's
model call (the strict fake upstream holds it open) is killed; after the restart no half summary exists
(no row, no context_compacted event), the turn is closed as the service closes any turn a crash left
open (interrupted), the next turn summarises again and answers, every request the provider received was
a valid history within its window, and the stored history still has every message."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import col, select

from app.storage.engine import Database
from app.storage.tables import ContextSummaryRow
from tests.api.test_context import SUMMARY, WINDOW, Conversation
from tests.fakes.upstream import FakeUpstream, RecordedRequest, Script, validate_history
from tests.support.process import ServerProcess

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.processes, pytest.mark.both_backends]

MODEL = "openai/small-window"
LONG = "tell me more about it " * 60


@pytest.fixture
def conversation() -> Conversation:
    return Conversation()


@pytest.fixture
def upstream(conversation: Conversation) -> Iterator[FakeUpstream]:
    with FakeUpstream(strict=True, window=WINDOW, responder=conversation) as running:
        yield running


def summarising(request: RecordedRequest) -> bool:
    return "[summary request]" in json.dumps(request.body)


async def _start(env: dict[str, str], log: Path, port: int | None = None) -> ServerProcess:
    server = ServerProcess(env, log, port=port)
    await asyncio.to_thread(server.start, 120.0)
    return server


async def _events(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    found = await client.get(
        f"/v1/sessions/{sid}/events", params={"after": 0, "format": "ndjson", "until_idle": "true"}
    )
    assert found.status_code == 200
    return [json.loads(line) for line in found.text.splitlines() if line.strip()]


async def _summaries(database_url: str, sid: str) -> list[ContextSummaryRow]:
    database = Database(database_url)
    try:
        async with database.read() as db:
            found = await db.exec(select(ContextSummaryRow).where(col(ContextSummaryRow.session_id) == sid))
            return list(found.all())
    finally:
        await database.dispose()


async def _until_summarising(
    client: httpx.AsyncClient, sid: str, upstream: FakeUpstream
) -> tuple[list[str], str]:
    """Posts long messages, each once the previous turn ended, until a turn's summary call is made (and
    held by the fake): the contents posted, and that turn's id."""
    contents: list[str] = []
    for n in range(12):
        contents.append(f"{n} {LONG}")
        posted = await client.post(f"/v1/sessions/{sid}/messages", json={"content": contents[-1]})
        assert posted.status_code == 202, posted.text
        turn_id = str(posted.json()["turn_id"])
        while not any(summarising(r) for r in upstream.requests):
            turn = (await client.get(f"/v1/sessions/{sid}/turns/{turn_id}")).json()
            if turn["status"] != "running":
                assert turn["status"] == "completed", turn
                break
            await asyncio.sleep(0.02)
        else:
            return contents, turn_id
    raise AssertionError("no turn asked for a summary")


async def test_kill_9_during_summarisation_stores_no_half_summary_and_the_next_turn_summarises(
    database_url: str, tmp_path: Path, upstream: FakeUpstream, conversation: Conversation
) -> None:
    models = tmp_path / "models.json"
    providers = {"fake": {"api_base": upstream.base_url, "models": {MODEL: {"context_window": WINDOW}}}}
    models.write_text(json.dumps({"providers": providers}))
    env = {
        "PARLEY_DATABASE_URL": database_url,
        "PARLEY_MODELS_FILE": str(models),
        "PARLEY_DEFAULT_MODEL": MODEL,
    }
    conversation.summary_script = Script.hang(60)
    first = await _start(env, tmp_path / "first.log")
    try:
        async with httpx.AsyncClient(base_url=first.base_url, timeout=30) as client:
            created = await client.post("/v1/sessions", json={"context": {"keep_turns": 1}})
            sid = str(created.json()["id"])
            contents, turn_id = await _until_summarising(client, sid, upstream)
            held = await upstream.await_request(summarising, within=10)
            assert not held.done
            await asyncio.to_thread(first.kill)
    finally:
        first.kill()
    assert await _summaries(database_url, sid) == []

    conversation.summary_script = None
    second = await _start(env, tmp_path / "second.log", port=first.port)
    try:
        async with httpx.AsyncClient(base_url=second.base_url, timeout=30) as client:
            base = f"/v1/sessions/{sid}"
            closed = (await client.get(f"{base}/turns/{turn_id}", params={"wait": "true"})).json()
            assert closed["status"] == "interrupted", closed
            assert closed["compaction"] is None
            before = await _events(client, sid)
            assert [e for e in before if e["type"] == "context_compacted"] == []
            context = (await client.get(f"{base}/context")).json()
            assert context["summary"] is None and context["compaction_due"] is True

            contents.append("and now?")
            answered = await client.post(f"{base}/messages?wait=true", json={"content": contents[-1]})
            assert answered.json()["status"] == "completed", answered.text
            after = await _events(client, sid)
            context = (await client.get(f"{base}/context")).json()
            page = await client.get(f"{base}/messages", params={"limit": 1000})
    finally:
        second.kill()

    [compacted] = [e for e in after if e["type"] == "context_compacted"]
    assert compacted["turn_id"] == answered.json()["turn_id"] and compacted["summary_written"] is True
    assert context["summary"]["content"] == SUMMARY
    assert context["summary"]["id"] == compacted["summary_id"]
    [row] = await _summaries(database_url, sid)
    assert row.id == compacted["summary_id"] and row.content == SUMMARY
    # Every request the provider got was a valid history within its window (the held one included).
    assert len([r for r in upstream.requests if summarising(r)]) == 2
    for request in upstream.requests:
        assert request.problems == [], request.problems
        assert validate_history(request.body["messages"]) == []
    # The record is whole: every user message, the interrupted turn's included.
    history = page.json()["chat_messages"]
    assert [m["content"] for m in history if m["type"] == "text" and m["role"] == "user"] == contents
    statuses = [m["status"] for m in history if m["type"] == "turn_done"]
    # The summary covers the oldest turns, in order.
    order = [m["turn_id"] for m in history if m["type"] == "turn_start"]
    summarized = compacted["summarized_turn_ids"]
    assert summarized and summarized == order[: len(summarized)] and turn_id in order
    assert statuses == ["completed"] * (len(contents) - 2) + ["interrupted", "completed"]
