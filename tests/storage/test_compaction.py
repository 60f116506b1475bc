"""The SQL of context compaction (app.storage.compaction) on a real migrated database: which summary a path
applies (docs/context.md): the one reaching furthest along it, never one of turns it does not hold."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from app.storage import compaction
from app.storage.engine import Database
from app.storage.tables import ContextSummaryRow
from tests.support.rows import T0, add_sessions

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

SID = "s_compaction"
# Two branches sharing t1..t3: A goes on with t4a, t5a; B with t4b.
PATH_A = ["t_1", "t_2", "t_3", "t_4a", "t_5a"]
PATH_B = ["t_1", "t_2", "t_3", "t_4b"]


def summary(summary_id: str, covers: list[str]) -> ContextSummaryRow:
    return ContextSummaryRow(
        id=summary_id,
        session_id=SID,
        through_turn_id=covers[-1],
        turn_ids=covers,
        content=f"summary {summary_id}",
        turn_id="t_x",
        model="parley/demo",
        created_at=T0,
    )


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url)
    await add_sessions(database, SID)
    yield database
    await database.dispose()


async def _written(database: Database, *rows: ContextSummaryRow) -> None:
    async with database.session() as db:
        for row in rows:
            await compaction.insert_summary(db, row)
        await db.commit()


async def _for(database: Database, path: list[str]) -> str | None:
    async with database.read() as db:
        found = await compaction.summary_for(db, SID, path)
    return found.id if found is not None else None


async def test_a_path_applies_the_summary_reaching_furthest_along_it_not_the_newest(
    database: Database,
) -> None:
    # A's summary through t4a, then B's through t2 (newer, shared turns, shorter), then B's own.
    await _written(
        database,
        summary("cs_a", PATH_A[:4]),
        summary("cs_b_shared", PATH_B[:2]),
        summary("cs_b", PATH_B[:4]),
    )
    assert await _for(database, PATH_A) == "cs_a"
    assert await _for(database, PATH_B) == "cs_b"
    # Before B's own turn: the shared turns' summary, though A's reaches further on A.
    assert await _for(database, PATH_B[:3]) == "cs_b_shared"
    assert await _for(database, ["t_1"]) is None


async def test_of_two_summaries_ending_on_one_turn_the_newest_applies(database: Database) -> None:
    await _written(database, summary("cs_old", PATH_A[:3]), summary("cs_new", PATH_A[2:3]))
    assert await _for(database, PATH_A) == "cs_new"
    assert await _for(database, []) is None
