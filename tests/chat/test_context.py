"""app.chat.context.next_call: what GET .../context shows, from rows on a real, migrated database (both
backends): the summary of the path the history follows, never another's, and the verbatim tail."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from app.chat.context import next_call
from app.llm.demo import DEMO_SMALL_MODEL
from app.llm.gateway import ModelGateway
from app.settings import Settings
from app.storage import compaction
from app.storage.blobs import DatabaseBlobs
from app.storage.engine import Database
from app.storage.tables import ChatMessageRow, ChatSessionRow, ContextSummaryRow
from tests.support.rows import T0

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

SID = "s_0000000000000c7x"


@pytest.fixture
async def database(settings: Settings) -> AsyncIterator[Database]:
    database = Database(settings.database_url)
    try:
        yield database
    finally:
        await database.dispose()


@pytest.fixture
async def models(settings: Settings) -> AsyncIterator[ModelGateway]:
    gateway = ModelGateway(settings)
    gateway.start()
    try:
        yield gateway
    finally:
        await gateway.stop()


async def _seed(database: Database, turns: int) -> ChatSessionRow:
    session = ChatSessionRow(
        id=SID,
        model=DEMO_SMALL_MODEL,
        tools=[],
        created_at=T0,
        updated_at=T0,
        context={"strategy": "auto", "keep_turns": 2, "reserve_tokens": 200},
    )
    rows = []
    for n in range(turns):
        turn = f"t_{n:012x}"
        rows.append(_start(f"m_s{n:010x}", turn, f"t_{n - 1:012x}" if n else None))
        rows.append(_message(f"m_u{n:010x}", turn, "user", f"question {n} " + "word " * 200))
        rows.append(_message(f"m_a{n:010x}", turn, "assistant", f"answer {n} " + "word " * 100))
    # A regenerate of the last turn, before it: another branch, not the active path (the head is the
    # last turn's).
    rows[-3:-3] = [
        _start("m_sbranch00", "t_branch", f"t_{turns - 2:012x}"),
        _message("m_ubranch00", "t_branch", "user", f"question {turns - 1} " + "word " * 200),
        _message("m_abranch00", "t_branch", "assistant", "another branch's answer"),
    ]
    async with database.session() as db:
        db.add(session)
        await db.flush()
        db.add_all(rows)
        await db.commit()
    return session


def _start(message_id: str, turn: str, parent: str | None) -> ChatMessageRow:
    return ChatMessageRow(
        id=message_id, session_id=SID, turn_id=turn, type="turn_start", parent_turn_id=parent, timestamp=T0
    )


def _message(message_id: str, turn: str, role: str, content: str) -> ChatMessageRow:
    return ChatMessageRow(
        id=message_id,
        session_id=SID,
        turn_id=turn,
        type="text",
        role=role,
        content=content,
        response_id=message_id if role == "assistant" else None,
        timestamp=T0,
    )


def _summary(summary_id: str, turns: list[str], content: str) -> ContextSummaryRow:
    return ContextSummaryRow(
        id=summary_id,
        session_id=SID,
        through_turn_id=turns[-1],
        turn_ids=turns,
        content=content,
        turn_id="t_writer",
        model=DEMO_SMALL_MODEL,
        created_at=T0,
    )


async def test_the_paths_own_summary_and_the_verbatim_tail(
    settings: Settings, database: Database, models: ModelGateway
) -> None:
    session = await _seed(database, 12)
    before = await next_call(
        settings, database, DatabaseBlobs(database, settings.files_chunk_bytes), models, session
    )
    assert before.summary is None and before.compaction_due is True
    assert before.history_tokens > (before.budget_tokens or 0)
    folded = [f"t_{n:012x}" for n in range(9)]
    async with database.session() as db:
        await compaction.insert_summary(db, _summary("cs_mine", folded, "- The user asked nine questions."))
        # Newer, but of another path (its last turn is not in this history): never applied.
        await compaction.insert_summary(db, _summary("cs_other", ["t_elsewhere"], "- Another branch."))
        await db.commit()
    after = await next_call(
        settings, database, DatabaseBlobs(database, settings.files_chunk_bytes), models, session
    )
    assert after.summary is not None and after.summary.id == "cs_mine"
    assert after.verbatim_turn_ids == [f"t_{n:012x}" for n in range(9, 12)]
    assert after.messages[0]["role"] == "system"
    assert "The user asked nine questions." in after.messages[0]["content"]
    assert after.messages[1] == {"role": "user", "content": "question 9 " + "word " * 200}
    assert after.sent_tokens <= (after.budget_tokens or 0) and after.compaction_due is False
    assert after.history_tokens == before.history_tokens  # the history itself is unchanged
    # The active path only: the other branch's turn is in neither the messages nor the tail.
    assert "another branch's answer" not in str(after.messages) and "t_branch" not in after.verbatim_turn_ids
