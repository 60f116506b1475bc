"""The turn view's SQL (app.storage.turn_queries) on a real migrated SQLite file: a session's turns found by
their turn_start rows, newest first and before a position, then their messages in history order."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.storage import repository, turn_queries, turn_tree
from app.storage.engine import Database
from app.storage.tables import ChatMessageRow, ChatSessionRow

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

SID, OTHER = "s_turns", "s_other"
T0 = "2026-02-28T06:30:00.000+00:00"
# Named against their order, so that a result sorted by id (or by the turn_id index) would differ from one
# in history order.
FIRST, SECOND, THIRD = "t_c_first", "t_b_second", "t_a_third"


def turn(session_id: str, turn_id: str, parent: str | None = None) -> list[ChatMessageRow]:
    """A whole turn: turn_start (after `parent`), the user's text, the answer, turn_done."""
    prefix = f"m_{session_id[-2:]}{turn_id[2]}"

    def row(name: str, type_: str, **fields: Any) -> ChatMessageRow:
        return ChatMessageRow(
            id=prefix + name, session_id=session_id, turn_id=turn_id, type=type_, timestamp=T0, **fields
        )

    return [
        row("start", "turn_start", parent_turn_id=parent),
        row("user", "text", role="user", content="hi", sender="U"),
        row("text", "text", role="assistant", content="yo"),
        row("done", "turn_done", status="completed"),
    ]


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    """SID has three turns, one after the other; OTHER has one between SID's first and second, with FIRST's
    id."""
    database = Database(database_url)
    async with database.session() as db:
        for sid in (SID, OTHER):
            db.add(ChatSessionRow(id=sid, model="parley/demo", tools=[], created_at=T0, updated_at=T0))
        await db.flush()
        for session_id, turn_id, parent in (
            (SID, FIRST, None),
            (OTHER, FIRST, None),
            (SID, SECOND, FIRST),
            (SID, THIRD, SECOND),
        ):
            await repository.insert_messages(db, turn(session_id, turn_id, parent))
        await db.commit()
    yield database
    await database.dispose()


async def start_position(database: Database, session_id: str, turn_id: str) -> int:
    async with database.session() as db:
        rows = await repository.list_messages(db, session_id)
    return next(r.position for r in rows if r.turn_id == turn_id and r.type == "turn_start" and r.position)


async def test_turn_position_is_the_position_of_the_turns_start(database: Database) -> None:
    async with database.session() as db:
        second = await turn_queries.turn_position(db, SID, SECOND)
        assert second == await start_position(database, SID, SECOND)
        assert await turn_queries.turn_position(db, OTHER, FIRST) == await start_position(
            database, OTHER, FIRST
        )
        assert await turn_queries.turn_position(db, SID, "t_unknown") is None
        assert await turn_queries.turn_position(db, OTHER, SECOND) is None  # another session's turn


async def test_latest_turn_ids_are_newest_first_and_limited(database: Database) -> None:
    async with database.session() as db:
        assert await turn_queries.latest_turn_ids(db, SID, limit=10, before_position=None) == [
            THIRD,
            SECOND,
            FIRST,
        ]
        assert await turn_queries.latest_turn_ids(db, SID, limit=2, before_position=None) == [THIRD, SECOND]
        assert await turn_queries.latest_turn_ids(db, OTHER, limit=10, before_position=None) == [FIRST]


async def test_latest_turn_ids_follow_the_active_path(database: Database) -> None:
    """A turn beside SECOND (a regenerate) heads the path: THIRD, under SECOND, leaves it; the head named
    on the session wins over the latest turn."""
    beside = "t_d_beside"
    async with database.session() as db:
        await repository.insert_messages(db, turn(SID, beside, FIRST))
        await db.commit()
    async with database.session() as db:
        assert await turn_queries.latest_turn_ids(db, SID, limit=10, before_position=None) == [beside, FIRST]
        await turn_tree.set_head(db, SID, THIRD)
        assert await turn_queries.latest_turn_ids(db, SID, limit=10, before_position=None) == [
            THIRD,
            SECOND,
            FIRST,
        ]
        assert await turn_tree.path(db, SID) == [FIRST, SECOND, THIRD]
        assert await turn_tree.path(db, SID, beside) == [FIRST, beside]
        assert await turn_tree.latest_in_subtree(db, SID, FIRST) == beside
        assert await turn_tree.latest_in_subtree(db, SID, SECOND) == THIRD
        assert await turn_tree.siblings(db, SID, {FIRST, None}) == {FIRST: [SECOND, beside], None: [FIRST]}
        rows = await repository.list_messages(db, SID, through_turn=beside)
        assert {r.turn_id for r in rows} == {FIRST, beside}


async def test_latest_turn_ids_before_a_position_skip_that_turn_and_the_newer(database: Database) -> None:
    third = await start_position(database, SID, THIRD)
    second = await start_position(database, SID, SECOND)
    first = await start_position(database, SID, FIRST)
    async with database.session() as db:
        assert await turn_queries.latest_turn_ids(db, SID, limit=10, before_position=third) == [SECOND, FIRST]
        assert await turn_queries.latest_turn_ids(db, SID, limit=1, before_position=second) == [FIRST]
        assert await turn_queries.latest_turn_ids(db, SID, limit=10, before_position=first) == []


async def test_messages_of_turns_are_the_sessions_rows_of_those_turns_in_history_order(
    database: Database,
) -> None:
    async with database.session() as db:
        rows = await turn_queries.messages_of_turns(db, SID, [THIRD, FIRST])
        assert await turn_queries.messages_of_turns(db, SID, []) == []
        assert await turn_queries.messages_of_turns(db, SID, ["t_unknown"]) == []
    assert [(r.turn_id, r.type) for r in rows] == [
        *((FIRST, t) for t in ("turn_start", "text", "text", "turn_done")),
        *((THIRD, t) for t in ("turn_start", "text", "text", "turn_done")),
    ]
    assert {r.session_id for r in rows} == {SID}  # OTHER's turn with FIRST's id is not among them
    positions = [r.position or 0 for r in rows]
    assert positions == sorted(positions)


async def test_the_open_turn_and_the_state_of_a_turn(database: Database) -> None:
    """open_turn_id: the session's turn with a turn_start and no turn_done (what another replica runs);
    turn_state: the turn's session and whether its end is stored, None for an unknown turn."""
    running = [r for r in turn(OTHER, "t_d_running") if r.type != "turn_done"]
    async with database.session() as db:
        assert await turn_queries.open_turn_id(db, OTHER) is None
        await repository.insert_messages(db, running)
        await db.commit()
    async with database.session() as db:
        assert await turn_queries.open_turn_id(db, OTHER) == "t_d_running"
        assert await turn_queries.open_turn_id(db, SID) is None
        assert await turn_queries.turn_state(db, "t_d_running") == (OTHER, False)
        assert await turn_queries.turn_state(db, SECOND) == (SID, True)
        assert await turn_queries.turn_state(db, "t_unknown") is None
