"""Crash repair at startup (app.turns.recovery), on a database a killed process left behind
(tests/streams/test_crash.py kills a real server process)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from app.storage import event_log, repository
from app.storage.engine import Database, sync_url
from app.storage.tables import ChatMessageRow, ChatSessionRow
from app.streaming.frames import Frame
from app.streaming.log.write_behind import WriteBehind
from app.turns.live import LocalLiveStatus
from app.turns.prompt import rebuild
from app.turns.recorder.stop import TOOL_INTERRUPTED_BY_RESTART
from app.turns.recovery import close_open_turns
from tests.fakes.strict import validate_history

pytestmark = pytest.mark.anyio

SID = "s_0123456789abcdef"
TURN = "t_000000000001"
# The turn started a minute ago; its text and tool began 1 s and 2.5 s into it.
_START = datetime.now(UTC) - timedelta(minutes=1)
T0, T1, T2 = ((_START + timedelta(seconds=s)).isoformat(timespec="milliseconds") for s in (0.0, 1.0, 2.5))


def row(id_: str, type_: str, timestamp: str, **fields: Any) -> ChatMessageRow:
    return ChatMessageRow(id=id_, session_id=SID, turn_id=TURN, type=type_, timestamp=timestamp, **fields)


def event(seq: int, type_: str, **fields: object) -> dict[str, object]:
    data = {"type": type_, "seq": seq, "session_id": SID, **fields}
    return {"session_id": SID, "seq": seq, "type": type_, "data": json.dumps(data)}


async def seed(database: Database) -> None:
    """A turn killed mid-answer: one tool call without a result, then text flushed up to "Hel"."""
    async with database.session() as db:
        db.add(ChatSessionRow(id=SID, model="parley/demo", tools=[], created_at=T0, updated_at=T0))
        await db.flush()
        await repository.insert_messages(
            db,
            [
                row("m_00000start", "turn_start", T0),
                row("m_000000user", "text", T0, role="user", content="hi", sender="User"),
                row(
                    "m_000000tool",
                    "tool_group",
                    T1,
                    role="assistant",
                    model="parley/demo",
                    response_id="r1",
                    tool_call_id="call_1",
                    tool_name="current_time",
                    arguments={},
                ),
                row(
                    "m_000000text",
                    "text",
                    T2,
                    role="assistant",
                    model="parley/demo",
                    response_id="r2",
                    content="Hel",
                ),
            ],
        )
        await event_log.insert_events(
            db,
            [
                event(1, "turn_start", id="m_00000start", turn_id=TURN, timestamp=T0),
                event(2, "tool_exec_start", id="m_000000tool"),
                event(3, "text_delta", id="m_000000text", text="Hel", timestamp=T0, model="parley/demo"),
                event(4, "text_delta", id="m_000000text", text="lo, wor"),
                event(5, "text_delta", id="m_000000text", text="ld"),
            ],
        )
        await db.commit()


async def test_an_open_turn_is_closed_as_interrupted_with_what_clients_saw(database_url: str) -> None:
    database = Database(database_url)
    await seed(database)
    delivered: list[Frame] = []
    logged_when_delivered: list[int] = []

    async def log_size() -> int:
        async with database.session() as db:
            return len(await event_log.events_after(db, SID, 0, 100))

    def deliver(batch: Sequence[tuple[str, Frame]]) -> None:
        delivered.extend(frame for _, frame in batch)
        logged_when_delivered.append(len(delivered))

    writer = WriteBehind(database, deliver=deliver)
    try:
        assert await close_open_turns(database, writer, LocalLiveStatus()) == 1
        # One transaction wrote the rows and the events, and delivered them only once committed.
        assert logged_when_delivered == [3]
        assert await log_size() == 8
        async with database.session() as db:
            rows = {r.id: r for r in await repository.list_messages(db, SID)}
            logged = await event_log.events_after(db, SID, 0, 100)
        assert await close_open_turns(database, writer, LocalLiveStatus()) == 0  # idempotent: it is closed
    finally:
        await database.dispose()

    text = rows["m_000000text"]
    assert (text.content, text.interrupted) == ("Hello, world", True)  # the logged deltas, not just "Hel"
    tool = rows["m_000000tool"]
    assert (tool.result, tool.is_error) == (TOOL_INTERRUPTED_BY_RESTART, True)
    done = list(rows.values())[-1]
    assert (done.type, done.status) == ("turn_done", "interrupted")
    # Like every turn's: from turn_start to turn_done, here the restart that closed it.
    assert done.duration_seconds is not None and done.duration_seconds >= 60
    assert done.duration_seconds == round(
        (datetime.fromisoformat(done.timestamp) - datetime.fromisoformat(T0)).total_seconds(), 3
    )

    assert [e.seq for e in logged] == [1, 2, 3, 4, 5, 6, 7, 8]
    tail = [json.loads(e.data) for e in logged[5:]]
    assert [t["type"] for t in tail] == ["agent_status", "agent_cancelled", "turn_done"]  # as a stop ends
    assert tail[0]["status"] == "idle"
    assert tail[1]["interrupted_message_ids"] == ["m_000000tool", "m_000000text"]
    assert tail[1]["interrupted_tool_call_ids"] == ["call_1"]
    assert tail[2] == {
        "type": "turn_done",
        "seq": 8,
        "session_id": SID,
        "id": done.id,
        "turn_id": TURN,
        "timestamp": done.timestamp,
        "duration_seconds": done.duration_seconds,
        "status": "interrupted",
    }
    assert [f.seq for f in delivered] == [6, 7, 8]

    # The next turn's history is one a strict provider accepts.
    history = rebuild([*rows.values(), row("m_00000next", "text", T0, role="user", content="and?")], None)
    assert validate_history(history) == []


async def test_text_whose_first_deltas_were_pruned_keeps_the_flushed_text(database_url: str) -> None:
    database = Database(database_url)
    await seed(database)
    async with database.session() as db:
        await event_log.prune_events(db, SID, keep_after=3)  # retention took the first delta
        await db.commit()
    writer = WriteBehind(database)
    try:
        await close_open_turns(database, writer, LocalLiveStatus())
        await writer.flush()
        async with database.session() as db:
            text = next(r for r in await repository.list_messages(db, SID) if r.id == "m_000000text")
    finally:
        await database.dispose()
    assert (text.content, text.interrupted) == ("Hel", True)


async def _recover(database: Database) -> list[dict[str, Any]]:
    """Runs the startup repair twice (it must be idempotent) and returns the events it logged."""
    writer = WriteBehind(database)
    async with database.session() as db:
        before = await event_log.last_event_seq(db, SID)
    for _ in range(2):
        await close_open_turns(database, writer, LocalLiveStatus())
        await writer.flush()
    async with database.session() as db:
        return [json.loads(e.data) for e in await event_log.events_after(db, SID, before, 100)]


async def _ended_turn(database: Database, *, log_start: bool) -> None:
    """A turn whose turn_done row committed but whose event the crash lost (kill -9 in the 50 ms gap)."""
    async with database.session() as db:
        db.add(ChatSessionRow(id=SID, model="parley/demo", tools=[], created_at=T0, updated_at=T0))
        await db.flush()
        await repository.insert_messages(
            db,
            [
                row("m_00000start", "turn_start", T0),
                row("m_000000user", "text", T0, role="user", content="hi", sender="User"),
                row("m_000000done", "turn_done", T2, duration_seconds=2.5, status="completed"),
            ],
        )
        start = [event(1, "turn_start", id="m_00000start", turn_id=TURN, timestamp=T0)] if log_start else []
        await event_log.insert_events(db, [*start, event(len(start) + 1, "agent_status", status="thinking")])
        await db.commit()


async def test_a_turn_end_whose_event_a_crash_lost_is_announced_once(database_url: str) -> None:
    database = Database(database_url)
    try:
        await _ended_turn(database, log_start=True)
        logged = await _recover(database)
    finally:
        await database.dispose()
    assert [(e["type"], e.get("status")) for e in logged] == [
        ("agent_status", "idle"),
        ("turn_done", "completed"),
    ]
    assert logged[1]["id"] == "m_000000done"
    assert logged[1]["duration_seconds"] == 2.5


async def test_a_turn_whose_start_left_the_log_is_not_announced_again(database_url: str) -> None:
    database = Database(database_url)
    try:
        await _ended_turn(database, log_start=False)
        assert await _recover(database) == []
    finally:
        await database.dispose()


INSERT_EVENT = "INSERT INTO events (session_id, seq, type, data) VALUES (:session_id, :seq, :type, :data)"


@pytest.mark.both_backends
async def test_an_event_postgresql_json_refuses_does_not_stop_the_repair(database_url: str) -> None:
    """An event an older version logged with the escape `\\u0000` (PostgreSQL's JSON functions refuse it,
    and the repair reads the log with them): the turn is still closed, with its flushed text at least."""
    database = Database(database_url)
    await seed(database)
    old = event(6, "text_delta", id="m_000000text", text="\x00!")
    assert "\\u0000" in str(old["data"])
    plain = create_engine(sync_url(database_url))  # no app.storage.pg_text mapping: the bytes as they were
    try:
        with plain.begin() as connection:
            connection.execute(text(INSERT_EVENT), old)
    finally:
        plain.dispose()
    writer = WriteBehind(database)
    try:
        assert await close_open_turns(database, writer, LocalLiveStatus()) == 1
        await writer.flush()
        async with database.session() as db:
            rows = await repository.list_messages(db, SID)
    finally:
        await database.dispose()
    closed = {r.id: r for r in rows}["m_000000text"]
    assert closed.interrupted is True and (closed.content or "").startswith("Hel")
    assert rows[-1].type == "turn_done" and rows[-1].status == "interrupted"


async def test_reasoning_killed_mid_stream_is_closed_with_its_logged_deltas(database_url: str) -> None:
    database = Database(database_url)
    async with database.session() as db:
        db.add(ChatSessionRow(id=SID, model="parley/demo", tools=[], created_at=T0, updated_at=T0))
        await db.flush()
        await repository.insert_messages(
            db,
            [
                row("m_00000start", "turn_start", T0),
                row("m_000000user", "text", T0, role="user", content="hi [think]", sender="User"),
                row("m_00thinking", "reasoning", T1, role="assistant", model="parley/demo", content="Let"),
            ],
        )
        await event_log.insert_events(
            db,
            [
                event(1, "turn_start", id="m_00000start", turn_id=TURN, timestamp=T0),
                event(2, "reasoning_delta", id="m_00thinking", text="Let", timestamp=T1, model="parley/demo"),
                event(3, "reasoning_delta", id="m_00thinking", text=" me think"),
            ],
        )
        await db.commit()
    writer = WriteBehind(database, deliver=lambda _batch: None)
    try:
        assert await close_open_turns(database, writer, LocalLiveStatus()) == 1
        async with database.session() as db:
            rows = {r.id: r for r in await repository.list_messages(db, SID)}
            logged = [json.loads(e.data) for e in await event_log.events_after(db, SID, 0, 100)]
    finally:
        await database.dispose()
    thinking = rows["m_00thinking"]
    assert (thinking.content, thinking.interrupted) == ("Let me think", True)
    cancelled = next(e for e in logged if e["type"] == "agent_cancelled")
    assert cancelled["interrupted_message_ids"] == ["m_00thinking"]
    # cut short, it never goes back to a model
    history = rebuild([*rows.values(), row("m_00000next", "text", T0, role="user", content="and?")], None)
    assert history == [{"role": "user", "content": "hi [think]\n\nand?"}]
