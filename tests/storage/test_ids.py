"""Message ids collide (48 random bits: about one collision in 350 by a million messages), and a
collision never surfaces as an error: whoever stores a fresh id takes another when it is held.

The repository's own rules on a real migrated SQLite file, then whole turns over a real socket with the
id generator forced to hand out ids the history already holds, for every kind of row a turn writes."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from app.protocol import ids
from app.storage import repository
from app.storage.engine import Database
from app.storage.tables import ChatMessageRow, ChatSessionRow, QueuedMessageRow
from app.streaming.log import texts
from app.streaming.log.pending_events import PendingEvents
from app.streaming.log.texts import TextBuffer
from tests.support.rows import T0, add_sessions
from tests.support.server import LiveServer
from tests.support.sse import EventReader

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    db = Database(database_url)
    await add_sessions(db, "s_a", "s_b")
    yield db
    await db.dispose()


def row(message_id: str, session_id: str = "s_b", type_: str = "text") -> ChatMessageRow:
    return ChatMessageRow(id=message_id, session_id=session_id, turn_id="t_1", type=type_, timestamp=T0)


def fresh_ids() -> Iterator[str]:
    return (f"m_fresh{n:07d}" for n in itertools.count())


async def stored(database: Database, session_id: str) -> list[str]:
    async with database.session() as db:
        return [r.id for r in await repository.list_messages(db, session_id)]


async def test_a_taken_id_is_replaced_and_the_rows_keep_their_order(database: Database) -> None:
    async with database.session() as db:
        await repository.insert_messages(db, [row("m_taken", "s_a")])
        fresh = fresh_ids()
        rows = [row("m_first"), row("m_taken", type_="turn_done"), row("m_last")]
        renamed = await repository.insert_messages(db, rows, lambda: next(fresh))
        await db.commit()
    assert renamed == {"m_taken": "m_fresh0000000"}
    assert [r.id for r in rows] == ["m_first", "m_fresh0000000", "m_last"]
    assert await stored(database, "s_b") == ["m_first", "m_fresh0000000", "m_last"]
    assert await stored(database, "s_a") == ["m_taken"]


async def test_ids_alike_within_one_batch_and_taken_again_are_all_replaced(database: Database) -> None:
    async with database.session() as db:
        await repository.insert_messages(db, [row("m_taken", "s_a"), row("m_fresh0000000", "s_a")])
        fresh = fresh_ids()
        rows = [row("m_same"), row("m_same", type_="tool_group"), row("m_taken", type_="turn_done")]
        await repository.insert_messages(db, rows, lambda: next(fresh))
        await db.commit()
    ids_ = await stored(database, "s_b")
    assert len(set(ids_)) == 3 and ids_[0] == "m_same" and "m_taken" not in ids_
    assert [r.type for r in rows] == ["text", "tool_group", "turn_done"]


async def test_without_a_generator_a_taken_id_is_an_error(database: Database) -> None:
    """Ids handed out already (a client saw them) are never changed silently."""
    async with database.session() as db:
        await repository.insert_messages(db, [row("m_taken", "s_a")])
        with pytest.raises(Exception, match=r"(?i)unique"):
            await repository.insert_messages(db, [row("m_taken")])


async def test_a_waiting_message_never_takes_an_id_a_message_holds(database: Database) -> None:
    fresh = fresh_ids()
    async with database.session() as db:
        await repository.insert_messages(db, [row("m_taken", "s_a")])
        waiting = QueuedMessageRow(id="m_taken", session_id="s_b", content="hi", sender="User", timestamp=T0)
        await repository.enqueue(db, waiting, lambda: next(fresh))
        again = QueuedMessageRow(
            id="m_fresh0000000", session_id="s_b", content="hi", sender="User", timestamp=T0
        )
        await repository.enqueue(db, again, lambda: next(fresh))
        await db.commit()
    assert (waiting.id, again.id) == ("m_fresh0000000", "m_fresh0000001")


async def test_a_session_never_takes_an_id_a_session_holds(database: Database) -> None:
    fresh = (f"s_fresh{n}" for n in itertools.count())
    async with database.session() as db:
        new = ChatSessionRow(id="s_a", model="parley/demo", tools=["calculate"], created_at=T0, updated_at=T0)
        await repository.insert_session(db, new, lambda: next(fresh))
        await db.commit()
        stored = await repository.get_session(db, "s_fresh0")
    assert new.id == "s_fresh0"
    assert stored is not None and stored.tools == ["calculate"]


@pytest.fixture
def colliding(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """The ids new message ids are drawn from first (each once, None for a random one), before random
    ones: filled by a test with ids that rows already hold."""
    pending: list[str | None] = []

    def new_message_id() -> str:
        drawn = pending.pop(0) if pending else None
        return drawn or ids.new_message_id()

    recorder = ("app.turns.recorder.rows", "app.turns.recorder.recorder", "app.turns.recorder.ends")
    for module in (*recorder, "app.turns.runtime.runner", "app.streaming.log.texts"):
        monkeypatch.setattr(f"{module}.new_message_id", new_message_id)
    monkeypatch.setattr("app.chat.messages.new_message_id", new_message_id)
    return pending


async def test_a_turn_whose_new_ids_are_all_taken_runs_as_any_other(
    server: LiveServer, colliding: list[str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every id the second turn draws (its start, the user message, both texts, the tool call, the
    end) is first one the first turn's rows hold: the turn completes, the history has no duplicate, and
    every event names the id its row was stored under."""
    streamed_renames: list[dict[str, str]] = []
    rename = texts.rename

    def spy(buffers: dict[str, TextBuffer], events: PendingEvents, renamed: dict[str, str]) -> None:
        streamed_renames.append(dict(renamed))
        rename(buffers, events, renamed)

    monkeypatch.setattr("app.streaming.log.texts.rename", spy)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
        first = await client.post(f"/v1/sessions/{sid}/messages?wait=true", json={"content": "hello"})
        assert first.status_code == 200, first.text
        history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
        taken = [m["id"] for m in history]
        # A taken id, then a free one, and again: every row's first id is taken, its second free.
        colliding.extend(drawn for taken_id in taken * 3 for drawn in (taken_id, None))
        async with EventReader(client, f"/v1/sessions/{sid}/events?after=0") as reader:
            posted = await client.post(f"/v1/sessions/{sid}/messages", json={"content": "what time is it?"})
            assert posted.status_code == 202, posted.text
            turn_id = posted.json()["turn_id"]
            await reader.wait_for(lambda e: e.event == "turn_done" and e.data["turn_id"] == turn_id)
        history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
    assert len(history) == len({m["id"] for m in history})
    new = history[len(taken) :]
    assert [m["type"] for m in new] == ["turn_start", "text", "text", "tool_group", "text", "turn_done"]
    assert not {m["id"] for m in new} & set(taken)
    assert new[1]["id"] == posted.json()["id"]  # the 202 named the id the message was stored under
    start = next(e for e in reader.events if e.event == "turn_start" and e.data["turn_id"] == turn_id)
    events = [e for e in reader.events if int(e.id) >= int(start.id)]
    assert events[-1].event == "turn_done" and events[-1].data["status"] == "completed"
    named = {e.data["id"] for e in events if e.data.get("id") is not None}
    assert named == {m["id"] for m in new}  # every event names its row's final id, and only those
    # The streamed texts' ids were taken too: their rows and their pending deltas were renamed.
    assert len(streamed_renames) == 2
