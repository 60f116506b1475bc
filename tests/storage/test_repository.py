"""app.storage.repository against a real, migrated database: a SQLite file (foreign keys on) and
PostgreSQL."""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import func
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select

from app.protocol.ids import new_message_id
from app.storage import event_log, repository
from app.storage.engine import Database
from app.storage.tables import ChatMessageRow, ChatSessionRow, EventRow, QueuedMessageRow, new_message
from tests.support.server import ROOT

# The raw statements' errors are the driver's own: sqlite3's or psycopg's.
DRIVER_INTEGRITY_ERRORS = (sqlite3.IntegrityError, psycopg.IntegrityError)

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

_n = itertools.count(1)


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    db = Database(database_url)
    yield db
    await db.dispose()


def stamp(n: int) -> str:
    return f"2026-02-28T06:30:{n:02d}.000+00:00"


def session_row(session_id: str, created_at: str = stamp(0)) -> ChatSessionRow:
    return ChatSessionRow(
        id=session_id,
        model="parley/demo",
        tools=["current_time"],
        created_at=created_at,
        updated_at=created_at,
    )


def message(session_id: str, turn_id: str, type_: str, **fields: Any) -> ChatMessageRow:
    n = next(_n)
    values: dict[str, Any] = {"id": f"m_{n:010x}", "timestamp": stamp(n % 60), **fields}
    return ChatMessageRow(session_id=session_id, turn_id=turn_id, type=type_, **values)


def queued_row(session_id: str, message_id: str, content: str) -> QueuedMessageRow:
    return QueuedMessageRow(
        id=message_id, session_id=session_id, content=content, sender="alice", timestamp=stamp(1)
    )


def event(session_id: str, seq: int, data: str = "{}") -> dict[str, Any]:
    return {"session_id": session_id, "seq": seq, "type": "text_delta", "data": data}


async def add_sessions(database: Database, *session_ids: str) -> None:
    async with database.session() as db:
        for session_id in session_ids:
            db.add(session_row(session_id))
        await db.commit()


async def add_messages(database: Database, rows: list[ChatMessageRow]) -> list[int]:
    async with database.session() as db:
        await repository.insert_messages(db, rows)
        await db.commit()
    # Raw inserts do not read the rowids back: the positions SQLite gave, in the rows' order.
    async with database.session() as db:
        query = select(ChatMessageRow.id, ChatMessageRow.position).where(
            col(ChatMessageRow.id).in_([row.id for row in rows])
        )
        found = {mid: position for mid, position in (await db.exec(query)).all()}
    positions: list[int] = []
    for row in rows:
        position = found[row.id]
        assert isinstance(position, int)
        positions.append(position)
    assert positions == sorted(positions)  # inserted in order: the history's order
    return positions


async def count(database: Database, model: type[Any], session_id: str) -> int:
    async with database.session() as db:
        query = select(func.count()).select_from(model).where(col(model.session_id) == session_id)
        return int((await db.exec(query)).one())


# --- sessions --------------------------------------------------------------------------------------------


async def test_session_round_trip(database: Database) -> None:
    await add_sessions(database, "s_a")
    async with database.session() as db:
        row = await repository.get_session(db, "s_a")
        missing = await repository.get_session(db, "s_nope")
    assert row is not None
    assert (row.model, row.tools, row.status, row.total_tokens, row.context_window) == (
        "parley/demo",
        ["current_time"],
        "active",
        0,
        None,
    )
    assert missing is None


_FIRST_READ = """
import asyncio, sys
from app.storage import repository
from app.storage.engine import Database

async def main() -> None:
    database = Database(sys.argv[1])
    async with database.session() as db:
        owned = await repository.owned_session(db, "", "s_a")
        rows = await repository.list_messages(db, "s_a")
    await database.dispose()
    print(owned.model, [row.type for row in rows])

asyncio.run(main())
"""


async def test_a_plain_sql_read_works_as_the_first_database_access_of_a_process(
    database: Database, database_url: str
) -> None:
    """A bare row reads its attributes through the ORM's instrumentation, set up when the mappers are
    configured, which the ORM itself does only at its first query: after a restart the first request may
    well be a history read."""
    await add_sessions(database, "s_a")
    await add_messages(database, [message("s_a", "t_1", "turn_start")])
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", _FIRST_READ, database_url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["parley/demo", "['turn_start']"]


async def test_plain_sql_reads_build_the_same_rows_as_the_orm(database: Database) -> None:
    """owned_session and list_messages read with plain SQL (one trip to the driver): every column comes
    back as SQLAlchemy's own read would give it (JSON decoded, booleans as bool, None kept)."""
    await add_sessions(database, "s_a")
    rows = [
        message("s_a", "t_1", "turn_start"),
        message(
            "s_a",
            "t_1",
            "tool_group",
            tool_call_id="c_1",
            tool_name="calculate",
            arguments={"expression": "1+1"},
            result="2",
            is_error=False,
            interrupted=True,
            duration_ms=5,
        ),
        message("s_a", "t_1", "turn_done", duration_seconds=1.25, status="completed"),
    ]
    await add_messages(database, rows)
    async with database.session() as db:
        plain = await repository.list_messages(db, "s_a")
        orm = (
            await db.exec(
                select(ChatMessageRow)
                .where(col(ChatMessageRow.session_id) == "s_a")
                .order_by(col(ChatMessageRow.position))
            )
        ).all()
        owned = await repository.owned_session(db, "", "s_a")
        by_orm = await repository.get_session(db, "s_a")
    columns = [c.name for c in ChatMessageRow.__table__.columns]  # type: ignore[attr-defined]
    assert [[getattr(r, c) for c in columns] for r in plain] == [
        [getattr(r, c) for c in columns] for r in orm
    ]
    assert [type(r.is_error) for r in plain] == [type(None), bool, type(None)]
    assert owned is not None and by_orm is not None
    session_columns = [c.name for c in ChatSessionRow.__table__.columns]  # type: ignore[attr-defined]
    assert [getattr(owned, c) for c in session_columns] == [getattr(by_orm, c) for c in session_columns]
    assert owned.tools == ["current_time"]


async def test_list_sessions_newest_first_with_keyset_paging(database: Database) -> None:
    async with database.session() as db:
        for session_id, created in [("s_1", 1), ("s_2", 2), ("s_3", 2), ("s_4", 3)]:
            db.add(session_row(session_id, stamp(created)))
        await db.commit()
        first = await repository.list_sessions(db, "", limit=2, before=None)
        assert [s.id for s in first] == ["s_4", "s_3"]
        last = first[-1]
        second = await repository.list_sessions(db, "", limit=2, before=(last.created_at, last.id))
        assert [s.id for s in second] == ["s_2", "s_1"]
        assert await repository.list_sessions(db, "", limit=2, before=(stamp(1), "s_1")) == []


async def test_sessions_are_found_and_listed_only_for_their_principal(database: Database) -> None:
    async with database.session() as db:
        db.add(session_row("s_a", stamp(1)))
        mine = session_row("s_b", stamp(2))
        mine.principal = "alice"
        db.add(mine)
        await db.commit()
        assert [s.id for s in await repository.list_sessions(db, "alice", limit=10, before=None)] == ["s_b"]
        assert [s.id for s in await repository.list_sessions(db, "", limit=10, before=None)] == ["s_a"]
        assert await repository.owned_session(db, "alice", "s_a") is None
        owned = await repository.owned_session(db, "alice", "s_b")
        assert owned is not None and owned.principal == "alice"
        assert await repository.owned_session(db, "bob", "s_b") is None


async def test_add_usage_accumulates_tokens(database: Database) -> None:
    await add_sessions(database, "s_a")
    async with database.session() as db:
        assert await repository.add_usage(
            db, "s_a", prompt=100, completion=20, window=32768, at=stamp(5)
        ) == (
            120,
            100,
        )
        assert await repository.add_usage(db, "s_a", prompt=150, completion=5, window=32768, at=stamp(6)) == (
            275,
            150,
        )
        await db.commit()
    async with database.session() as db:
        row = await repository.get_session(db, "s_a")
    assert row is not None
    assert (row.total_tokens, row.context_used, row.context_window, row.updated_at) == (
        275,
        150,
        32768,
        stamp(6),
    )


# --- chat messages ---------------------------------------------------------------------------------------


async def test_a_page_bounded_by_message_ids(database: Database) -> None:
    """page_messages finds its bounds by id in the same statement: the same pages as list_messages with
    their positions, and no rows for an id that is not a message of the session (another session's
    included), which the caller then reports as an invalid cursor."""
    await add_sessions(database, "s_a", "s_b")
    start = message("s_a", "t_1", "turn_start")  # the history is the active path's turns
    rows = [message("s_a", "t_1", "text", role="user", content=f"msg {i}") for i in range(10)]
    await add_messages(database, [start, *rows])
    other = message("s_b", "t_9", "text", role="user", content="other")
    await add_messages(database, [message("s_b", "t_9", "turn_start"), other])
    ids = [row.id for row in rows]

    def contents(found: list[ChatMessageRow]) -> list[str | None]:
        return [m.content for m in found]

    async with database.read() as db:
        first = await repository.page_messages(db, "s_a", limit=4)
        assert contents(first) == [None, "msg 0", "msg 1", "msg 2"]
        after = await repository.page_messages(db, "s_a", limit=4, after_id=ids[3])
        assert contents(after) == ["msg 4", "msg 5", "msg 6", "msg 7"]
        before = await repository.page_messages(db, "s_a", limit=3, before_id=ids[8])
        assert contents(before) == ["msg 5", "msg 6", "msg 7"]
        between = await repository.page_messages(db, "s_a", limit=10, after_id=ids[2], before_id=ids[6])
        assert contents(between) == ["msg 3", "msg 4", "msg 5"]
        assert await repository.page_messages(db, "s_a", limit=3, after_id=ids[9]) == []
        assert await repository.page_messages(db, "s_a", limit=3, after_id="m_nope") == []
        assert await repository.page_messages(db, "s_a", limit=3, before_id=other.id) == []


async def test_list_messages_in_position_order_with_paging(database: Database) -> None:
    await add_sessions(database, "s_a", "s_b")
    # Ids and timestamps run backwards, so only `position` gives the insertion order.
    rows = [
        message(
            "s_a",
            "t_1",
            "text",
            role="user",
            content=f"msg {i}",
            id=f"m_{99 - i:010d}",
            timestamp=stamp(59 - i),
        )
        for i in range(10)
    ]
    positions = await add_messages(database, rows)
    await add_messages(database, [message("s_b", "t_9", "text", role="user", content="other")])
    assert positions == sorted(positions)
    assert len(set(positions)) == 10
    p = positions

    def contents(found: list[ChatMessageRow]) -> list[str | None]:
        return [m.content for m in found]

    async with database.session() as db:
        everything = await repository.list_messages(db, "s_a")
        assert contents(everything) == [f"msg {i}" for i in range(10)]
        assert [m.position for m in everything] == p

        assert contents(await repository.list_messages(db, "s_a", limit=3)) == ["msg 0", "msg 1", "msg 2"]
        after = await repository.list_messages(db, "s_a", after_position=p[3], limit=4)
        assert contents(after) == ["msg 4", "msg 5", "msg 6", "msg 7"]
        assert contents(await repository.list_messages(db, "s_a", after_position=p[7])) == ["msg 8", "msg 9"]
        # `before` gives the `limit` messages just before it, still oldest first.
        before = await repository.list_messages(db, "s_a", before_position=p[8], limit=3)
        assert contents(before) == ["msg 5", "msg 6", "msg 7"]
        assert contents(await repository.list_messages(db, "s_a", before_position=p[2])) == ["msg 0", "msg 1"]
        between = await repository.list_messages(db, "s_a", after_position=p[1], before_position=p[5])
        assert contents(between) == ["msg 2", "msg 3", "msg 4"]
        assert await repository.list_messages(db, "s_a", after_position=p[9]) == []
        assert await repository.list_messages(db, "s_a", before_position=p[0]) == []
        assert contents(await repository.list_messages(db, "s_b")) == ["other"]
        assert await repository.list_messages(db, "s_nope") == []

        assert await repository.message_position(db, "s_a", rows[4].id) == p[4]
        assert await repository.message_position(db, "s_b", rows[4].id) is None


async def test_update_message_and_turn_messages(database: Database) -> None:
    await add_sessions(database, "s_a")
    text = message("s_a", "t_1", "text", role="assistant", content="Hel", response_id="m_r")
    rows = [message("s_a", "t_1", "turn_start"), text, message("s_a", "t_2", "turn_start")]
    await add_messages(database, rows)
    async with database.session() as db:
        await repository.update_message(db, text.id, {"content": "Hello", "interrupted": True})
        await db.commit()
    async with database.session() as db:
        turn = await repository.turn_messages(db, "t_1")
    assert [(m.type, m.content, m.interrupted) for m in turn] == [
        ("turn_start", None, None),
        ("text", "Hello", True),
    ]


async def test_json_arguments_round_trip(database: Database) -> None:
    await add_sessions(database, "s_a")
    arguments = {"expression": "6*7", "nested": [1, None, "ü"]}
    rows = [
        message(
            "s_a", "t_1", "tool_group", tool_call_id="call_1", tool_name="calculate", arguments=arguments
        ),
        message("s_a", "t_1", "tool_group", tool_call_id="call_2", tool_name="calculate", arguments='{"bad'),
    ]
    await add_messages(database, rows)
    async with database.session() as db:
        found = await repository.list_messages(db, "s_a")
    assert [m.arguments for m in found] == [arguments, '{"bad']


async def test_open_turns(database: Database) -> None:
    await add_sessions(database, "s_a", "s_b")
    await add_messages(
        database,
        [
            message("s_a", "t_done", "turn_start"),
            message("s_a", "t_done", "text", role="user", content="hi"),
            message("s_a", "t_done", "turn_done", duration_seconds=0.5),
            message("s_a", "t_open", "turn_start"),
            message("s_a", "t_open", "text", role="user", content="again"),
            message("s_b", "t_other", "turn_start"),
        ],
    )
    async with database.session() as db:
        open_rows = await repository.open_turns(db)
    assert [(row.session_id, row.turn_id, row.type) for row in open_rows] == [
        ("s_a", "t_open", "turn_start"),
        ("s_b", "t_other", "turn_start"),
    ]

    await add_messages(
        database, [message("s_a", "t_open", "turn_done"), message("s_b", "t_other", "turn_done")]
    )
    async with database.session() as db:
        assert await repository.open_turns(db) == []


# --- the waiting line ------------------------------------------------------------------------------------


async def test_queued_and_dequeue(database: Database) -> None:
    await add_sessions(database, "s_a", "s_b", "s_c")
    async with database.session() as db:
        # Ids in reverse order: the waiting line is ordered by position, not by id.
        for message_id, content in [("m_zz", "first"), ("m_yy", "second"), ("m_xx", "third")]:
            await repository.enqueue(db, queued_row("s_a", message_id, content), new_message_id)
        await repository.enqueue(db, queued_row("s_b", "m_bb", "other"), new_message_id)
        await db.commit()
    async with database.session() as db:
        assert [q.content for q in await repository.queued(db, "s_a")] == ["first", "second", "third"]
        assert sorted(await repository.sessions_with_queue(db)) == ["s_a", "s_b"]
        assert await repository.queued(db, "s_c") == []

        await repository.dequeue(db, ["m_zz", "m_xx"])
        await repository.dequeue(db, [])
        await db.commit()
    async with database.session() as db:
        assert [q.id for q in await repository.queued(db, "s_a")] == ["m_yy"]
        assert [q.id for q in await repository.queued(db, "s_b")] == ["m_bb"]
        await repository.dequeue(db, ["m_yy", "m_bb"])
        await db.commit()
        assert await repository.sessions_with_queue(db) == []


# --- the event log ---------------------------------------------------------------------------------------


async def test_last_event_seqs_reads_the_heads_of_many_sessions_at_once(database: Database) -> None:
    """The fan-out's poll: each named session's last seq, none for a session without events, also past
    the thousand ids one statement takes (s_b comes after 1,500 others)."""
    await add_sessions(database, "s_a", "s_b")
    async with database.session() as db:
        await event_log.insert_events(db, [event("s_a", seq) for seq in (1, 2, 3)] + [event("s_b", 1)])
        await db.commit()
    async with database.session() as db:
        names = ["s_a", *(f"s_none{i}" for i in range(1500)), "s_b"]
        assert await event_log.last_event_seqs(db, names) == {"s_a": 3, "s_b": 1}
        assert await event_log.last_event_seqs(db, []) == {}


async def test_events_insert_last_seq_and_replay(database: Database) -> None:
    await add_sessions(database, "s_a", "s_b")
    async with database.session() as db:
        assert await event_log.last_event_seq(db, "s_a") == 0
        await event_log.insert_events(db, [event("s_a", seq, f'{{"n": {seq}}}') for seq in (1, 2, 3, 4)])
        await event_log.insert_events(db, [event("s_b", 1), event("s_b", 2)])
        await db.commit()
    async with database.session() as db:
        assert await event_log.last_event_seq(db, "s_a") == 4
        assert await event_log.last_event_seq(db, "s_b") == 2
        assert await event_log.last_event_seq(db, "s_nope") == 0

        replay = await event_log.events_after(db, "s_a", 1, 10)
        assert [(e.seq, e.type, e.data) for e in replay] == [
            (2, "text_delta", '{"n": 2}'),
            (3, "text_delta", '{"n": 3}'),
            (4, "text_delta", '{"n": 4}'),
        ]
        assert [e.seq for e in await event_log.events_after(db, "s_a", 0, 2)] == [1, 2]
        assert await event_log.events_after(db, "s_a", 4, 10) == []
        assert [e.session_id for e in await event_log.events_after(db, "s_b", 0, 10)] == ["s_b", "s_b"]


# What the hot path's whole-column statements carry (PostgreSQL sends them as binary arrays): JSON with
# quotes and escapes, backslashes, braces and commas (an array literal's own syntax), non-ASCII text, an
# empty string, the word NULL, a long string.
AWKWARD = [
    '{"type":"text_delta","text":"say \\"hi\\", then {a,b} \\\\ done"}',
    '{"text":"Grüße, 東京 🚀\\nnext line\\ttab"}',
    "",
    "NULL",
    '"' + "x, y} " * 2000 + '"',
]


async def test_the_event_log_and_streamed_text_keep_every_byte(database: Database) -> None:
    """Events logged in one batch and streamed texts written in one statement come back exactly as they
    went in, whatever their characters: a mangled byte would be a stream that replays differently from
    what clients saw live."""
    await add_sessions(database, "s_a")
    rows = [message("s_a", "t_1", "text", role="assistant", content="") for _ in AWKWARD]
    await add_messages(database, rows)
    async with database.session() as db:
        await event_log.log_events(
            db, [("s_a", seq, f"type {seq}", data) for seq, data in enumerate(AWKWARD, start=1)]
        )
        await repository.set_message_texts(
            db, [(row.id, text) for row, text in zip(rows, AWKWARD, strict=True)]
        )
        await db.commit()
    async with database.session() as db:
        logged = await event_log.events_between(db, "s_a", 0, len(AWKWARD) + 1)
        stored = {row.id: row.content for row in await repository.list_messages(db, "s_a")}
    assert logged == [(seq, f"type {seq}", data, None) for seq, data in enumerate(AWKWARD, start=1)]
    assert [stored[row.id] for row in rows] == AWKWARD


async def test_a_log_read_gives_each_turn_edge_its_turn(database: Database) -> None:
    """A replay from the log (a resume, a hole filled on another replica) carries a turn_start's and a
    turn_done's turn as the live frame did; every other event, even one naming the turn, carries none."""
    await add_sessions(database, "s_a")
    start = '{"type":"turn_start","seq":1,"session_id":"s_a","id":"m_1","turn_id":"t_1","timestamp":"x"}'
    status = '{"type":"agent_status","seq":2,"session_id":"s_a","status":"thinking","turn_id":"t_1"}'
    text = '{"type":"text_delta","seq":3,"session_id":"s_a","id":"m_2","text":"{\\"turn_id\\":\\"t_9\\"}"}'
    done = '{"type":"turn_done","seq":4,"session_id":"s_a","id":"m_3","turn_id":"t_1","status":"completed"}'
    logged = [("turn_start", start), ("agent_status", status), ("text_delta", text), ("turn_done", done)]
    async with database.session() as db:
        await event_log.log_events(db, [("s_a", seq, t, d) for seq, (t, d) in enumerate(logged, start=1)])
        await db.commit()
    async with database.session() as db:
        read = await event_log.events_between(db, "s_a", 0, 5)
    assert [(seq, type_, turn) for seq, type_, _, turn in read] == [
        (1, "turn_start", "t_1"),
        (2, "agent_status", None),
        (3, "text_delta", None),
        (4, "turn_done", "t_1"),
    ]


async def test_a_number_is_logged_once(database: Database) -> None:
    """Numbers are taken in the transaction that logs them (streaming.log.sequencing): a duplicate is a bug,
    and the log refuses it rather than ignoring it."""
    await add_sessions(database, "s_a")
    async with database.session() as db:
        await event_log.insert_events(db, [event("s_a", 1, '"first"')])
        await db.commit()
    async with database.session() as db:
        with pytest.raises(DRIVER_INTEGRITY_ERRORS, match=r"(?i)unique|duplicate key"):
            await event_log.insert_events(db, [event("s_a", 1, '"again"')])
    async with database.session() as db:
        assert [(e.seq, e.data) for e in await event_log.events_after(db, "s_a", 0, 10)] == [(1, '"first"')]


async def test_a_batch_with_events_of_a_deleted_session_still_commits(database: Database) -> None:
    # The log is written behind: a session deleted meanwhile must not fail the other sessions' events.
    await add_sessions(database, "s_a", "s_gone")
    async with database.session() as db:
        assert await repository.delete_session(db, "s_gone")
        await db.commit()
    async with database.session() as db:
        await event_log.insert_events(db, [event("s_a", 1), event("s_gone", 7), event("s_a", 2)])
        await db.commit()
    async with database.session() as db:
        assert [e.seq for e in await event_log.events_after(db, "s_a", 0, 10)] == [1, 2]


# --- deleting a session ----------------------------------------------------------------------------------


async def test_deleting_a_session_cascades(database: Database) -> None:
    await add_sessions(database, "s_a", "s_keep")
    for session_id in ("s_a", "s_keep"):
        await add_messages(
            database,
            [
                message(session_id, f"t_{session_id}", "turn_start"),
                message(session_id, f"t_{session_id}", "text", role="user", content="hi"),
            ],
        )
        async with database.session() as db:
            await repository.enqueue(db, queued_row(session_id, f"m_q_{session_id}", "later"), new_message_id)
            await event_log.insert_events(db, [event(session_id, 1), event(session_id, 2)])
            await db.commit()
    tables: list[type[Any]] = [ChatMessageRow, QueuedMessageRow, EventRow]
    assert [await count(database, t, "s_a") for t in tables] == [2, 1, 2]

    async with database.session() as db:
        assert await repository.delete_session(db, "s_a") is True
        await db.commit()

    assert [await count(database, t, "s_a") for t in tables] == [0, 0, 0]
    assert [await count(database, t, "s_keep") for t in tables] == [2, 1, 2]
    async with database.session() as db:
        assert await repository.get_session(db, "s_a") is None
        assert await repository.delete_session(db, "s_a") is False
        assert await repository.sessions_with_queue(db) == ["s_keep"]


async def test_foreign_keys_are_enforced(database: Database) -> None:
    async with database.session() as db:
        # The hot path's raw statements raise the driver's error, not SQLAlchemy's wrapper of it.
        with pytest.raises(DRIVER_INTEGRITY_ERRORS, match=r"(?i)foreign key"):
            await repository.insert_messages(db, [message("s_missing", "t_1", "turn_start")])
        await db.rollback()
    async with database.session() as db:
        with pytest.raises(IntegrityError, match=r"(?i)foreign key"):
            await repository.enqueue(db, queued_row("s_missing", "m_q", "x"), new_message_id)
        await db.rollback()


async def test_a_row_from_new_message_is_the_row_its_constructor_makes(database: Database) -> None:
    """tables.new_message builds a row without SQLModel's per-column attribute events: the same values,
    defaults and fields set as ChatMessageRow(...), attributes that can be set, and rows that both the
    plain-SQL insert and the ORM store and read back alike."""
    fields: dict[str, Any] = {
        "session_id": "s_new",
        "turn_id": "t_1",
        "type": "tool_group",
        "timestamp": stamp(1),
        "role": "assistant",
        "tool_name": "lookup",
        "arguments": {"q": "x", "n": [1, 2]},
        "truncated": False,
    }
    built = new_message(id="m_0000000a01", **fields)
    made = ChatMessageRow(id="m_0000000a01", **fields)
    assert built.model_dump() == made.model_dump()
    assert built.__pydantic_fields_set__ == made.__pydantic_fields_set__
    assert built.__pydantic_extra__ is None and built.__pydantic_private__ is None
    assert new_message(id="m_0000000a03", **fields).__dict__ is not built.__dict__  # no dict shared
    with pytest.raises(TypeError, match="not columns of chat_messages: \\['colour'\\]"):
        new_message(id="m_0000000a04", colour="red", **fields)
    built.content = "set later"  # through SQLAlchemy's instrumentation, as on any row
    by_orm = new_message(id="m_0000000a02", **fields)
    async with database.session() as db:
        db.add(session_row("s_new"))
        await db.flush()
        await repository.insert_messages(db, [built])
        db.add(by_orm)
        await db.commit()
    async with database.session() as db:
        stored = await repository.list_messages(db, "s_new")
    assert [(r.id, r.content, r.arguments, r.truncated) for r in stored] == [
        ("m_0000000a01", "set later", {"q": "x", "n": [1, 2]}, False),
        ("m_0000000a02", None, {"q": "x", "n": [1, 2]}, False),
    ]


async def test_add_usage_sets_the_context_scale_when_given_and_keeps_it_otherwise(database: Database) -> None:
    await add_sessions(database, "s_a")
    async with database.session() as db:
        await repository.add_usage(
            db, "s_a", prompt=10, completion=1, window=100, at=stamp(5), context_scale=1.25
        )
        await repository.add_usage(db, "s_a", prompt=20, completion=1, window=100, at=stamp(6))
        await db.commit()
    async with database.session() as db:
        row = await repository.get_session(db, "s_a")
    assert row is not None and row.context_scale == 1.25
