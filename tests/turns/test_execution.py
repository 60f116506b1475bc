"""One turn's execution (app.turns.execution.run_turn): a turn whose preparation fails or is stopped before
its recorder takes charge is still closed, exactly once, by a real TurnRecorder over a real WriteBehind on
a real migrated SQLite file.

`AgentFactory.prepare` is exercised only up to the model layer: resolving even the demo model waits for
litellm to load (ModelGateway.ready), so here a gateway that was never started stands for a model layer
still loading, and the turn waits in its preparation. A completed turn runs end to end in tests/api.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any

import pytest

from app.llm.gateway import ModelGateway
from app.llm.types import UsagePart
from app.protocol.schemas import QueuedMessage
from app.settings import DEMO_MODEL, Settings
from app.storage import event_log, repository
from app.storage.blobs import DatabaseBlobs
from app.storage.engine import Database
from app.storage.tables import ChatMessageRow, ChatSessionRow, new_message
from app.streaming.log.write_behind import WriteBehind
from app.tools.registry import build_default_registry
from app.turns.agent import AgentRun, ResponseFinished, ResponseStarted, TextChunk
from app.turns.execution import AgentFactory, _opening_notes, run_turn
from app.turns.live import LocalLiveStatus
from app.turns.prompt import rebuild
from app.turns.recorder.recorder import TurnRecorder

pytestmark = pytest.mark.anyio

SID = "s_execution"
TURN = "t_000000000001"
T0 = "2026-02-28T06:30:00.000+00:00"
SAFE_MESSAGE = "The turn failed because of an internal error."


@dataclass
class Turn:
    database: Database
    session: ChatSessionRow
    recorder: TurnRecorder
    live: LocalLiveStatus

    async def rows(self) -> list[tuple[str, str | None]]:
        async with self.database.session() as db:
            return [(r.type, r.status or r.code) for r in await repository.list_messages(db, SID)]

    async def events(self) -> list[dict[str, object]]:
        async with self.database.session() as db:
            return [json.loads(e.data) for e in await event_log.events_after(db, SID, 0, 100)]


@pytest.fixture
async def turn(database_url: str) -> AsyncIterator[Turn]:
    """A turn opened as the runner opens it: turn_start and the user's message committed."""
    database = Database(database_url)
    session = ChatSessionRow(id=SID, model=DEMO_MODEL, tools=[], created_at=T0, updated_at=T0)
    async with database.session() as db:
        db.add(session)
        await db.commit()
    writer, live = WriteBehind(database), LocalLiveStatus()
    recorder = TurnRecorder(
        writer=writer, events=writer.publisher(SID), live=live, session_id=SID, turn_id=TURN, model=DEMO_MODEL
    )
    message = QueuedMessage(id="m_000000000001", content="hi", sender="User", timestamp=T0, delivery="steer")
    await recorder.open([message])
    yield Turn(database, session, recorder, live)
    await writer.stop()
    await database.dispose()


async def unreadable_history() -> AgentRun:
    raise RuntimeError("disk I/O error while reading /var/lib/secret")


async def test_a_preparation_that_fails_closes_the_turn_as_failed(
    turn: Turn, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="app.turns.execution"):
        await run_turn(unreadable_history(), turn.recorder)

    assert await turn.rows() == [
        ("turn_start", None),
        ("text", None),
        ("error", "internal_error"),
        ("turn_done", "failed"),
    ]
    events = await turn.events()
    assert [e["type"] for e in events][-3:] == ["error", "agent_status", "turn_done"]
    error, done = events[-3], events[-1]
    assert (error["code"], error["message"]) == ("internal_error", SAFE_MESSAGE)  # never the cause
    assert done["status"] == "failed"
    assert turn.recorder.closed and turn.live.get(SID).agent_status == "idle"
    # The cause goes to the log only.
    (record,) = [r for r in caplog.records if r.name == "app.turns.execution"]
    assert record.getMessage() == f"turn {TURN} could not run"
    assert record.exc_info is not None and "disk I/O error" in str(record.exc_info[1])


async def never_prepared() -> AgentRun:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def run_stopped(recorder: TurnRecorder, prepare: Coroutine[Any, Any, AgentRun], **stop: bool) -> None:
    """Runs the turn in its own task, as the runner does, and stops it while it prepares."""
    cancelling: list[int] = []

    async def turn_task() -> None:
        await run_turn(prepare, recorder)
        task = asyncio.current_task()
        assert task is not None
        cancelling.append(task.cancelling())

    task = recorder.task = asyncio.create_task(turn_task())
    await asyncio.sleep(0.05)  # the task runs, waiting in its preparation
    assert not task.done()
    assert recorder.request_stop(**stop) is True
    await task
    # The stop was handled, not passed on: the task ends normally, no longer marked as being cancelled.
    assert cancelling == [0]


async def test_a_turn_stopped_while_it_prepares_closes_as_cancelled(turn: Turn, settings: Settings) -> None:
    models = ModelGateway(settings)  # never started: the model layer is still loading
    blobs = DatabaseBlobs(turn.database, settings.files_chunk_bytes)
    factory = AgentFactory(settings, turn.database, models, build_default_registry(), blobs)
    await run_stopped(turn.recorder, factory.prepare(turn.session, TURN, should_pause=lambda: False))

    assert await turn.rows() == [("turn_start", None), ("text", None), ("turn_done", "cancelled")]
    types = [e["type"] for e in await turn.events()]
    assert types[-3:] == ["agent_status", "agent_cancelled", "turn_done"]


async def test_a_stop_by_the_server_while_it_prepares_closes_as_interrupted(turn: Turn) -> None:
    await run_stopped(turn.recorder, never_prepared(), by_server=True)
    assert (await turn.rows())[-1] == ("turn_done", "interrupted")


async def delete_the_session(turn: Turn) -> None:
    """The session goes away under the turn: its closing rows can no longer be written."""
    async with turn.database.session() as db:
        await repository.delete_session(db, SID)
        await db.commit()


async def test_a_failure_while_closing_a_failed_turn_is_logged_and_never_raised(
    turn: Turn, caplog: pytest.LogCaptureFixture
) -> None:
    await delete_the_session(turn)
    with caplog.at_level(logging.ERROR, logger="app.turns.execution"):
        await run_turn(unreadable_history(), turn.recorder)
    messages = [r.getMessage() for r in caplog.records if r.name == "app.turns.execution"]
    assert messages == [f"turn {TURN} could not run", f"closing turn {TURN} failed"]


async def test_a_failure_while_closing_a_stopped_turn_is_logged_and_never_raised(
    turn: Turn, caplog: pytest.LogCaptureFixture
) -> None:
    await delete_the_session(turn)
    with caplog.at_level(logging.ERROR, logger="app.turns.execution"):
        await run_stopped(turn.recorder, never_prepared())
    messages = [r.getMessage() for r in caplog.records if r.name == "app.turns.execution"]
    assert messages == [f"closing turn {TURN} failed"]


@dataclass
class _Model:
    context_window: int | None = 8192


class ScriptedAgent:
    """What TurnRecorder.record reads of an AgentRun: its model and its events, here a plain answer."""

    model = _Model()

    def __init__(self, *parts: str) -> None:
        self.parts = parts

    async def run(self) -> AsyncIterator[object]:
        yield ResponseStarted()
        for part in self.parts:
            yield TextChunk(part)
        usage = UsagePart(prompt_tokens=7, completion_tokens=3, total_tokens=10)
        yield ResponseFinished("".join(self.parts), [], "stop", usage, 12)


def count_writes(turn: Turn, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The turn's own writes (WriteBehind.transaction), each noted as it begins."""
    writes: list[str] = []
    transaction = turn.recorder.writer.transaction

    def counted(session_id: str, **kwargs: Any) -> Any:
        writes.append(session_id)
        return transaction(session_id, **kwargs)

    monkeypatch.setattr(turn.recorder.writer, "transaction", counted)
    return writes


@pytest.mark.both_backends
async def test_a_completed_turn_commits_its_last_response_with_its_end(
    turn: Turn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last response (no calls: the agent ends after it) is written by the turn's end: one write
    for both, its events before the end's, the response's text whole and its usage counted."""
    writes = count_writes(turn, monkeypatch)
    await turn.recorder.record(ScriptedAgent("Hello", ", world"))  # type: ignore[arg-type]

    assert writes == [SID]
    assert await turn.rows() == [
        ("turn_start", None),
        ("text", None),
        ("text", None),
        ("turn_done", "completed"),
    ]
    async with turn.database.session() as db:
        answer = (await repository.list_messages(db, SID))[2]
        stored = await repository.get_session(db, SID)
    assert (answer.content, answer.duration_ms, bool(answer.interrupted)) == ("Hello, world", 12, False)
    assert stored is not None and stored.total_tokens == 10
    events = await turn.events()
    assert [e["type"] for e in events][-5:] == [
        "text_delta",
        "response_done",
        "token_usage",
        "agent_status",
        "turn_done",
    ]
    assert events[-1]["status"] == "completed" and turn.live.get(SID).agent_status == "idle"


class TwoAnswers(ScriptedAgent):
    """An agent that, unlike AgentRun, goes on after a response without calls: another response."""

    async def run(self) -> AsyncIterator[object]:
        async for event in super().run():
            yield event
        async for event in ScriptedAgent("Second.").run():
            yield event


async def test_a_response_without_calls_that_is_not_the_last_is_written_before_what_follows(
    turn: Turn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recorder defers a response without calls to the turn's end; should anything follow it after
    all, it is written first, in order, and only the last one rides the end."""
    writes = count_writes(turn, monkeypatch)
    await turn.recorder.record(TwoAnswers("First."))  # type: ignore[arg-type]

    assert writes == [SID, SID]
    async with turn.database.session() as db:
        texts = [m.content for m in await repository.list_messages(db, SID) if m.role == "assistant"]
    assert texts == ["First.", "Second."]
    types = [e["type"] for e in await turn.events()]
    assert types.count("response_done") == 2 and types[-1] == "turn_done"
    assert types.index("response_done") < types.index("text_delta", types.index("response_done"))


@pytest.mark.both_backends
async def test_a_stop_while_the_completed_turns_end_waits_to_write_is_recorded(turn: Turn) -> None:
    """A stop that comes while the end of a completed turn waits for another write of the session (an
    interrupt's row) is taken, and that end records it: the turn is cancelled, its answer kept whole."""
    writer = turn.recorder.writer
    held, release = asyncio.Event(), asyncio.Event()

    async def other_write() -> None:
        async with writer.transaction(SID):
            held.set()
            await release.wait()

    other = asyncio.create_task(other_write())
    await held.wait()
    recording = turn.recorder.task = asyncio.create_task(turn.recorder.record(ScriptedAgent("Done.")))  # type: ignore[arg-type]
    turn.recorder.begin()
    await asyncio.sleep(0.05)
    assert not recording.done()  # its end waits for the other write
    assert turn.recorder.request_stop() is True
    release.set()
    await asyncio.gather(other, recording)

    assert (await turn.rows())[-2:] == [("text", None), ("turn_done", "cancelled")]
    async with turn.database.session() as db:
        answer = (await repository.list_messages(db, SID))[-2]
    assert (answer.content, bool(answer.interrupted)) == ("Done.", False)
    events = await turn.events()
    assert [e["type"] for e in events][-5:] == [
        "response_done",
        "token_usage",
        "agent_status",
        "agent_cancelled",
        "turn_done",
    ]
    assert events[-2]["interrupted_message_ids"] == []


async def test_a_sessions_first_opening_holds_its_whole_history_and_a_later_one_does_not(turn: Turn) -> None:
    """The turn builds its prompt from the rows its opening wrote instead of reading them back, only
    when they are all of the session's history: its first turn's."""
    async with turn.database.session() as db:
        stored = await repository.list_messages(db, SID)
    held = turn.recorder.rows.take_history()
    assert held is not None
    fields = ("id", "session_id", "turn_id", "type", "role", "content", "sender", "timestamp", "client_tools")

    def view(rows: list[ChatMessageRow]) -> list[tuple[object, ...]]:
        return [tuple(getattr(r, f) for f in fields) for r in rows]

    assert view(held) == view(stored)
    assert rebuild(held, "be brief") == rebuild(stored, "be brief")
    assert turn.recorder.rows.take_history() is None  # taken once

    writer = turn.recorder.rows.writer
    later = TurnRecorder(
        writer=writer,
        events=writer.publisher(SID),
        live=turn.live,
        session_id=SID,
        turn_id="t_000000000002",
        model=DEMO_MODEL,
    )
    message = QueuedMessage(
        id="m_000000000002", content="again", sender="User", timestamp=T0, delivery="steer"
    )
    await later.open([message])
    assert later.rows.take_history() is None  # the session held rows before: the turn reads them


def test_the_turns_prompt_reads_the_notes_of_the_messages_that_started_it_only() -> None:
    """A user message's stored note (AG-UI's context) joins the system prompt of the turn it starts, so a
    turn resumed after a restart, or started on another replica from the waiting line, reads it too; a
    message steered in later, and any other turn's message, is not read."""

    def row(n: int, turn_id: str, type_: str, role: str | None, note: str | None = None) -> ChatMessageRow:
        return new_message(
            id=f"m_{n}", session_id="s_a", turn_id=turn_id, type=type_, role=role, timestamp=T0, note=note
        )

    rows = [
        row(1, "t_old", "turn_start", None),
        row(2, "t_old", "text", "user", "an older turn's note"),
        row(3, "t_old", "text", "assistant"),
        row(4, "t_new", "turn_start", None),
        row(5, "t_new", "text", "user", "the page: billing"),
        row(6, "t_new", "text", "user"),
        row(7, "t_new", "text", "user", "the todo: call Ana"),
        row(8, "t_new", "text", "assistant"),
        row(9, "t_new", "text", "user", "a steered message's note"),
    ]
    assert _opening_notes(rows, "t_new") == ["the page: billing", "the todo: call Ana"]
    assert _opening_notes(rows, "t_old") == ["an older turn's note"]
