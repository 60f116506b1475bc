"""What app.turns.control maps for every TurnControl: a waiting-line row as a client reads it
(`queued_message`), and the answer to a post (`accepted`), field by field."""

from __future__ import annotations

import pytest

from app.protocol.ids import new_message_id
from app.protocol.schemas import QueuedMessage
from app.storage import repository
from app.storage.engine import Database
from app.storage.tables import ChatSessionRow, QueuedMessageRow
from app.turns.control import TurnRunning, accepted, queued_message

SID = "s_control"
T0 = "2026-02-28T06:30:00.000+00:00"
T1 = "2026-02-28T06:30:01.500+00:00"

MESSAGE = QueuedMessage(
    id="m_000000000042",
    content="and then?",
    sender="Ada",
    client_message_id="tab-7",
    timestamp=T1,
    delivery="interrupt",
)


@pytest.mark.anyio
async def test_queued_message_maps_a_stored_waiting_line_row(database_url: str) -> None:
    database = Database(database_url)
    try:
        async with database.session() as db:
            db.add(ChatSessionRow(id=SID, model="parley/demo", tools=[], created_at=T0, updated_at=T0))
            await db.flush()
            row = QueuedMessageRow(session_id=SID, **MESSAGE.model_dump())
            await repository.enqueue(db, row, new_message_id)
            await db.commit()
        async with database.session() as db:
            (stored,) = await repository.queued(db, SID)
    finally:
        await database.dispose()
    assert stored.position is not None
    # Every field a client reads, as stored; the row's session and position stay behind.
    assert queued_message(stored).model_dump() == MESSAGE.model_dump()


def test_accepted_by_a_turn_names_the_turn_and_is_not_queued() -> None:
    assert accepted(SID, MESSAGE, "t_000000000001").model_dump() == {
        "id": "m_000000000042",
        "session_id": SID,
        "content": "and then?",
        "sender": "Ada",
        "client_message_id": "tab-7",
        "timestamp": T1,
        "turn_id": "t_000000000001",
        "queued": False,
        "delivery": "interrupt",
        "attachments": [],
    }


def test_accepted_without_a_turn_is_queued() -> None:
    plain = MESSAGE.model_copy(update={"client_message_id": None, "delivery": "queue"})
    answer = accepted(SID, plain, None)
    assert (answer.turn_id, answer.queued, answer.delivery) == (None, True, "queue")
    assert answer.client_message_id is None


def test_turn_running_carries_the_running_turns_id() -> None:
    error = TurnRunning("t_000000000009")
    assert error.turn_id == "t_000000000009"
    assert str(error) == "t_000000000009"
