"""Seeds a migrated SQLite file directly, before its server starts, through the app's own code.

Running 2,000 real turns to get a 10,000-message history would take longer than the rest of the run, so
the storage stage writes the rows itself: `ChatMessageRow`s inserted with `repository.insert_messages`,
events serialized by the app's own `Publisher` and numbered as the write-behind numbers them (so the
log holds byte for byte what a live turn would have logged) and written with `event_log.insert_events`.

- a history session: complete turns of turn_start, user text, assistant text (~1 KB), turn_done, every
  third turn with a tool call (tool_group row) and a second text, until it holds `messages` rows;
- a replay session: complete turns as the live stream numbers them (turn_start, user_message, thinking,
  200 text_deltas, response_done, token_usage, idle, turn_done) with their chat rows, until its log holds
  `events` events;
- `idle` sessions with no history, for the idle-streams stage.
Every turn is closed (turn_done row and event), so the server's crash recovery finds nothing to repair.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.protocol.clock import now_iso
from app.protocol.events import (
    AgentStatus,
    ResponseDone,
    ResponseInfo,
    TextDelta,
    TokenUsage,
    TurnDone,
    TurnStart,
    Usage,
    UserMessage,
)
from app.protocol.ids import new_message_id, new_session_id, new_turn_id
from app.storage import event_log, repository
from app.storage.engine import Database
from app.storage.tables import ChatMessageRow, ChatSessionRow
from app.streaming.frames import Draft, Frame, Publisher

MODEL = "openai/bench"
USER_TEXT = "Tell me about the history of the city, its bridges and the river that runs through it."
ANSWER = ("The city grew around its river crossing, and every century added a bridge. " * 14).strip()
WORDS = [word + " " for word in ANSWER.split()]
DELTAS_PER_TURN = 200
BATCH = 2_000


@dataclass
class Seeded:
    history_session: str
    history_messages: int
    history_ids: list[str]
    replay_session: str
    replay_events: int
    idle_sessions: list[str]


def _session(session_id: str, at: str) -> ChatSessionRow:
    return ChatSessionRow(id=session_id, title="bench", model=MODEL, tools=[], created_at=at, updated_at=at)


def _row(session_id: str, turn_id: str, type_: str, at: str, **fields: Any) -> ChatMessageRow:
    return ChatMessageRow(
        id=fields.pop("id", None) or new_message_id(),
        session_id=session_id,
        turn_id=turn_id,
        type=type_,
        timestamp=at,
        **fields,
    )


def _user(session_id: str, turn_id: str, at: str, **fields: Any) -> ChatMessageRow:
    return _row(session_id, turn_id, "text", at, role="user", content=USER_TEXT, sender="User", **fields)


def _answer(
    session_id: str, turn_id: str, at: str, content: str, duration_ms: int, response_id: str, **fields: Any
) -> ChatMessageRow:
    return _row(
        session_id,
        turn_id,
        "text",
        at,
        role="assistant",
        content=content,
        model=MODEL,
        duration_ms=duration_ms,
        response_id=response_id,
        **fields,
    )


def _done(session_id: str, turn_id: str, at: str, **fields: Any) -> ChatMessageRow:
    return _row(session_id, turn_id, "turn_done", at, duration_seconds=4.2, status="completed", **fields)


def history_turn(session_id: str, index: int, at: str) -> list[ChatMessageRow]:
    turn = new_turn_id()
    response = new_message_id()
    rows = [
        _row(session_id, turn, "turn_start", at),
        _user(session_id, turn, at),
        _answer(session_id, turn, at, ANSWER, 4100, response),
    ]
    if index % 3 == 2:
        call = "call_" + new_message_id()[2:]
        rows.append(
            _row(
                session_id,
                turn,
                "tool_group",
                at,
                tool_call_id=call,
                tool_name="current_time",
                arguments={"timezone": "Europe/Paris"},
                result="2026-11-22T21:00:00+01:00",
                is_error=False,
                duration_ms=1,
                model=MODEL,
                response_id=response,
            )
        )
        rows.append(_answer(session_id, turn, at, ANSWER, 4000, new_message_id()))
    rows.append(_done(session_id, turn, at))
    return rows


def replay_turn(events: Publisher, deltas: int, at: str, total: int) -> list[ChatMessageRow]:
    """One turn's events, published on `events` (its outbox collects the drafts), and its chat rows."""
    session_id = events.session_id
    turn = new_turn_id()
    start, user, text, done = (new_message_id() for _ in range(4))
    events.emit(TurnStart, id=start, turn_id=turn, timestamp=at)
    events.emit(
        UserMessage,
        id=user,
        text=USER_TEXT,
        timestamp=at,
        turn_id=turn,
        model=MODEL,
        sender="User",
        queued=False,
    )
    events.emit(AgentStatus, status="thinking", turn_id=turn)
    events.emit(TextDelta, id=text, text=WORDS[0], timestamp=at, model=MODEL)
    for i in range(1, deltas):
        events.text_delta(text, WORDS[i % len(WORDS)])
    usage = Usage(prompt_tokens=300, completion_tokens=deltas, total_tokens=300 + deltas)
    info = ResponseInfo(model=MODEL, finish_reason="stop", usage=usage)
    events.emit(ResponseDone, id=text, duration_ms=4100, response=info)
    events.emit(
        TokenUsage,
        context_used=300,
        context_window=None,
        context_percent=None,
        session_total_tokens=total,
        model=MODEL,
    )
    events.emit(AgentStatus, status="idle", turn_id=turn)
    events.emit(TurnDone, id=done, turn_id=turn, timestamp=at, duration_seconds=4.2, status="completed")
    content = "".join(WORDS[i % len(WORDS)] for i in range(deltas))
    return [
        _row(session_id, turn, "turn_start", at, id=start),
        _user(session_id, turn, at, id=user),
        _answer(session_id, turn, at, content, 4100, new_message_id(), id=text),
        _done(session_id, turn, at, id=done),
    ]


async def _add_sessions(database: Database, sessions: list[ChatSessionRow]) -> None:
    async with database.session() as db:
        db.add_all(sessions)
        await db.commit()


async def _insert(
    database: Database, rows: list[ChatMessageRow], events: list[tuple[str, Frame]] | None = None
) -> None:
    async with database.session() as db:
        for start in range(0, len(rows), BATCH):
            await repository.insert_messages(db, rows[start : start + BATCH])
        if events:
            params = [{"session_id": s, "seq": f.seq, "type": f.type, "data": f.data} for s, f in events]
            for start in range(0, len(params), BATCH):
                await event_log.insert_events(db, params[start : start + BATCH])
        await db.commit()


async def seed(target: Path | str, *, messages: int, events: int, idle: int) -> Seeded:
    """Into the SQLite file `target`, or the database whose URL it is (PostgreSQL)."""
    database = Database(target if isinstance(target, str) else f"sqlite+aiosqlite:///{target}")
    at = now_iso()
    try:
        history_id, replay_id = new_session_id(), new_session_id()
        idle_ids = [new_session_id() for _ in range(idle)]
        await _add_sessions(database, [_session(s, at) for s in (history_id, replay_id, *idle_ids)])

        history: list[ChatMessageRow] = []
        turns = 0
        while len(history) < messages:
            history.extend(history_turn(history_id, turns, at))
            turns += 1
        await _insert(database, history)

        drafts: list[Draft] = []
        publisher = Publisher(replay_id, drafts.append)
        replay_rows: list[ChatMessageRow] = []
        while len(drafts) < events:
            # The last turn is shortened so the log ends near `events` (it holds at least that many).
            deltas = max(1, min(DELTAS_PER_TURN, events - len(drafts) - 7))
            replay_rows.extend(replay_turn(publisher, deltas, at, total=len(drafts)))
        frames = [(replay_id, draft.number(seq)) for seq, draft in enumerate(drafts, start=1)]
        await _insert(database, replay_rows, frames)
        if database.dialect == "postgresql":
            # Statistics, as autovacuum gathers them within a minute of a bulk load: without them the
            # planner takes the seeded 10,000-message session for a few rows (a 40 ms sort, not 0.1 ms).
            async with database.engine.connect() as connection:
                await connection.execution_options(isolation_level="AUTOCOMMIT")
                await connection.exec_driver_sql("ANALYZE")
    finally:
        await database.dispose()
    return Seeded(history_id, len(history), [r.id for r in history], replay_id, len(frames), idle_ids)
