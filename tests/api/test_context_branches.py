"""A compacted session's branches (docs/context.md, docs/api.md#branches): a summary belongs to a path.
A regenerate of an older turn, an activate back to the first path and a fork each send, and show in
GET .../context, only a summary of their own path; another branch's summary text never reaches the
strict fake upstream. Each summary the fake writes is numbered, so every request names the one it sent."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import col, select

from app.settings import Settings
from app.storage.engine import Database
from app.storage.tables import ContextSummaryRow
from app.turns.context.planner import SUMMARY_HEADING
from tests.api.test_context import WINDOW, Conversation
from tests.fakes.upstream import FakeUpstream, RecordedRequest, Script, validate_history
from tests.support.server import LiveServer, live_server

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

MODEL = "openai/fake-model"
LONG = "tell me more about it " * 60


class NumberedSummaries(Conversation):
    """The conversation of test_context, whose summaries are `Summary N.` (N counts from 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.summaries = itertools.count(1)

    def __call__(self, body: dict[str, Any]) -> Script:
        if summarising(body):
            return Script.text(f"Summary {next(self.summaries)}. The user asked for more, at length.")
        return super().__call__(body)


def summarising(body: dict[str, Any]) -> bool:
    return "[summary request]" in str(body["messages"][-1].get("content"))


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(strict=True, window=WINDOW, responder=NumberedSummaries()) as running:
        yield running


@pytest.fixture
def configured(settings: Settings, upstream: FakeUpstream, tmp_path: Path) -> Settings:
    path = tmp_path / "models.json"
    models = {"fake": {"api_base": upstream.base_url, "models": {MODEL: {"context_window": WINDOW}}}}
    path.write_text(json.dumps({"providers": models}))
    return settings.model_copy(update={"models_file": path, "default_model": MODEL})


@pytest.fixture
def server(configured: Settings) -> Iterator[LiveServer]:
    with live_server(configured) as running:
        yield running


async def _ask(client: httpx.AsyncClient, sid: str, content: str) -> str:
    done = await client.post(f"/v1/sessions/{sid}/messages?wait=true", json={"content": content})
    assert done.json()["status"] == "completed", done.text
    return str(done.json()["turn_id"])


async def _path_ids(client: httpx.AsyncClient, sid: str) -> list[str]:
    """The active path's turn ids, in the history's order."""
    page = await client.get(f"/v1/sessions/{sid}/messages", params={"limit": 1000})
    return [m["turn_id"] for m in page.json()["chat_messages"] if m["type"] == "turn_start"]


async def _summaries(database_url: str, sid: str) -> dict[str, ContextSummaryRow]:
    """The session's summaries by content."""
    database = Database(database_url)
    try:
        async with database.read() as db:
            found = await db.exec(select(ContextSummaryRow).where(col(ContextSummaryRow.session_id) == sid))
            return {row.content: row for row in found.all()}
    finally:
        await database.dispose()


def _sent_summary(request: RecordedRequest) -> str | None:
    """The summary a model call sent (in its system message), or None."""
    messages = request.body["messages"]
    system = str(messages[0].get("content")) if messages[0]["role"] == "system" else ""
    if SUMMARY_HEADING not in system:
        return None
    return system.split(SUMMARY_HEADING, 1)[1].strip()


def _answers_since(upstream: FakeUpstream, start: int) -> list[RecordedRequest]:
    return [r for r in upstream.requests[start:] if not summarising(r.body)]


async def test_a_regenerate_on_an_older_branch_an_activate_and_a_fork_send_their_own_paths_summary(
    server: LiveServer, upstream: FakeUpstream, configured: Settings
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={"context": {"keep_turns": 1}})).json()["id"]
        base = f"/v1/sessions/{sid}"
        first_path = [await _ask(client, sid, f"A{n} {LONG}") for n in range(14)]
        written = await _summaries(configured.database_url, sid)
        assert len(written) >= 2, written
        # The first path's summaries, oldest first: regenerate the last turn of the newest one, so that
        # the new branch keeps the older summaries' turns and loses the newest's.
        on_first = sorted(written.values(), key=lambda r: r.position or 0)
        newest = on_first[-1]
        older = {r.content for r in on_first[:-1]}
        head_a = first_path[-1]
        assert (await client.get(f"{base}/context")).json()["summary"]["id"] == newest.id

        mark = len(upstream.requests)
        regenerated = await client.post(f"{base}/turns/{newest.through_turn_id}/regenerate")
        assert regenerated.status_code == 202, regenerated.text
        branch_turn = regenerated.json()["turn_id"]
        closed = (await client.get(f"{base}/turns/{branch_turn}", params={"wait": "true"})).json()
        assert closed["status"] == "completed", closed
        second_path = [branch_turn] + [await _ask(client, sid, f"B{n} {LONG}") for n in range(4)]
        path_b = await _path_ids(client, sid)
        assert newest.through_turn_id not in path_b and path_b[-5:] == second_path
        on_b = await client.get(f"{base}/context")
        sent_on_b = [_sent_summary(r) for r in _answers_since(upstream, mark)]
        written = await _summaries(configured.database_url, sid)
        # Each call of the new branch sent no summary or one of its own path, never the newest of the
        # first path (or one written after it there).
        for text in sent_on_b:
            assert text != newest.content
            if text is not None:
                assert written[text].through_turn_id in path_b
        assert {t for t in sent_on_b if t is not None} - older, "the new branch wrote no summary of its own"
        summary_b = on_b.json()["summary"]
        assert summary_b["summarized_turn_ids"][-1] in path_b and summary_b["id"] != newest.id
        assert summary_b["content"] in sent_on_b

        # Back to the first path: its newest summary again, none of the second path's.
        activated = await client.post(f"{base}/turns/{head_a}/activate")
        assert activated.status_code == 200, activated.text
        on_a = (await client.get(f"{base}/context")).json()
        assert on_a["summary"]["id"] == newest.id
        # The next call's messages are the first path's: none of the second path's turns.
        users = [str(m["content"]) for m in on_a["messages"] if m["role"] == "user"]
        assert users and all(u.startswith("A") for u in users)
        assert set(on_a["verbatim_turn_ids"]) <= set(first_path)
        mark = len(upstream.requests)
        await _ask(client, sid, f"A14 {LONG}")
        path_a = await _path_ids(client, sid)
        assert path_a[:14] == first_path
        written = await _summaries(configured.database_url, sid)
        for request in _answers_since(upstream, mark):
            text = _sent_summary(request)
            assert text is not None and written[text].through_turn_id in path_a
            assert text not in {t for t in sent_on_b if t not in older}

        # A fork of the second path: a new session whose turns are copies; no summary of the original's
        # applies to it (its ids are new), its own is written from its own history.
        forked = await client.post(f"/v1/sessions/{sid}/fork", json={"turn_id": second_path[-1]})
        assert forked.status_code == 201, forked.text
        fork = forked.json()["id"]
        assert (await client.get(f"/v1/sessions/{fork}/context")).json()["summary"] is None
        mark = len(upstream.requests)
        await _ask(client, fork, f"F0 {LONG}")
        fork_context = (await client.get(f"/v1/sessions/{fork}/context")).json()
        fork_path = await _path_ids(client, fork)
        fork_written = await _summaries(configured.database_url, fork)
        original = set(await _summaries(configured.database_url, sid))
        for request in _answers_since(upstream, mark):
            text = _sent_summary(request)
            assert text is None or (text in fork_written and text not in original)
        if fork_context["summary"] is not None:
            assert fork_context["summary"]["summarized_turn_ids"][-1] in fork_path

    for request in upstream.requests:
        assert request.problems == [], request.problems
        assert validate_history(request.body["messages"]) == []
