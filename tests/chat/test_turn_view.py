"""The turn view and `?wait=true` (app.chat.turn_view.Turns) over the real runner, sessions and messages on a
real SQLite file (tests/support/runtime.py: every turn runs until it is stopped). Over HTTP, with the
query parameters and a client that leaves: tests/api/test_wait.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from app.chat.errors import InvalidCursor
from app.chat.files import Files
from app.chat.idempotency import Idempotency
from app.chat.messages import Messages
from app.chat.sessions import Sessions
from app.chat.stream_tokens import StreamTokens
from app.chat.turn_view import Turns
from app.errors import Conflict, NotFound, WaitTimeout
from app.protocol.schemas import MessageCreate
from app.settings import Settings
from app.storage.blobs import DatabaseBlobs
from app.storage.tables import ChatSessionRow
from app.turns.runtime.runner import Runner
from tests.support.runtime import Runtime, runtime

pytestmark = pytest.mark.anyio

SID = "s_turn_view"
ALICE = "alice"


@dataclass
class View:
    parts: Runtime
    sessions: Sessions
    messages: Messages
    turns: Turns
    session: ChatSessionRow

    def turns_with(self, *, settings: Settings | None = None, runner: Runner | None = None) -> Turns:
        """The turn view over other settings or another turn control."""
        return Turns(
            settings or self.parts.settings,
            self.parts.database,
            self.sessions,
            self.messages,
            runner or self.parts.runner,
        )

    async def ended_turn(self) -> str:
        turn_id = await self.parts.start_turn(self.session)
        await self.parts.runner.cancel(SID)
        return turn_id


@pytest.fixture
async def view(settings: Settings) -> AsyncIterator[View]:
    async with runtime(settings) as parts:
        idempotency = Idempotency(parts.database, ttl_seconds=60)
        stream_tokens = StreamTokens(parts.settings, parts.database)
        blobs = DatabaseBlobs(parts.database, parts.settings.files_chunk_bytes)
        sessions = Sessions(
            parts.settings,
            parts.database,
            parts.runner,
            parts.models,
            parts.tools,
            idempotency,
            stream_tokens,
            blobs,
        )
        files = Files(parts.settings, parts.database, parts.models, blobs)
        messages = Messages(
            parts.settings, parts.database, sessions, parts.runner, parts.broker, idempotency, files
        )
        turns = Turns(parts.settings, parts.database, sessions, messages, parts.runner)
        yield View(parts, sessions, messages, turns, await parts.add_session(SID, principal=ALICE))


async def test_pages_go_back_from_the_newest_turns(view: View) -> None:
    first, second, third = [await view.ended_turn() for _ in range(3)]
    newest = await view.turns.page(ALICE, SID, limit=2, before=None)
    assert [t.turn_id for t in newest.turns] == [second, third]  # oldest first
    assert newest.next_cursor == second
    older = await view.turns.page(ALICE, SID, limit=2, before=newest.next_cursor)
    assert ([t.turn_id for t in older.turns], older.next_cursor) == ([first], None)
    assert [t.status for t in newest.turns + older.turns] == ["cancelled"] * 3


async def test_a_cursor_that_names_no_turn_of_the_session_is_invalid(view: View) -> None:
    with pytest.raises(InvalidCursor) as caught:
        await view.turns.page(ALICE, SID, limit=2, before="t_unknown")
    assert (caught.value.code, caught.value.details) == ("invalid_cursor", {"cursor": "t_unknown"})


async def test_get_finds_the_sessions_turn_and_404s_otherwise(view: View) -> None:
    turn_id = await view.ended_turn()
    turn = await view.turns.get(ALICE, SID, turn_id)
    assert (turn.turn_id, turn.status, [m.content for m in turn.user_messages]) == (
        turn_id,
        "cancelled",
        ["hi"],
    )
    with pytest.raises(NotFound) as caught:
        await view.turns.get(ALICE, SID, "t_unknown")
    assert caught.value.details == {"session_id": SID, "turn_id": "t_unknown"}
    with pytest.raises(NotFound):  # another principal's session is as absent as a missing one
        await view.turns.get("mallory", SID, turn_id)


class EndsNeverHeardOf(Runner):
    """A turn control that hears of no turn's end (as a process would of a turn another one ran)."""

    async def turn_end(self, turn_id: str) -> None:
        await asyncio.Event().wait()


async def test_wait_returns_an_ended_turn_at_once(view: View) -> None:
    turn_id = await view.ended_turn()
    p = view.parts
    blobs = DatabaseBlobs(p.database, p.settings.files_chunk_bytes)
    deaf = EndsNeverHeardOf(
        p.settings, p.database, p.writer, p.models, p.tools, p.live, p.broker, blobs=blobs
    )
    turns = view.turns_with(runner=deaf)
    async with asyncio.timeout(1):  # the ended turn is read, not waited for
        turn = await turns.wait(ALICE, SID, turn_id, timeout=None)
    assert turn.status == "cancelled"


async def test_wait_returns_the_turn_once_it_ends(view: View) -> None:
    turn_id = await view.parts.start_turn(view.session)
    waiting = asyncio.create_task(view.turns.wait(ALICE, SID, turn_id, timeout=None))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await view.parts.runner.cancel(SID)
    async with asyncio.timeout(5):
        turn = await waiting
    assert (turn.turn_id, turn.status) == (turn_id, "cancelled")


async def test_a_wait_past_its_timeout_is_a_504_and_the_turn_goes_on(view: View) -> None:
    turn_id = await view.parts.start_turn(view.session)
    with pytest.raises(WaitTimeout) as caught:
        await view.turns.wait(ALICE, SID, turn_id, timeout=0.1)
    assert caught.value.code == "wait_timeout"
    assert caught.value.details == {"turn_id": turn_id, "message_id": None, "timeout": 0.1}
    assert (await view.parts.runner.statuses([SID]))[SID].turn_id == turn_id  # still running


async def test_the_servers_wait_timeout_caps_a_longer_request(view: View) -> None:
    capped = view.turns_with(settings=view.parts.settings.model_copy(update={"wait_timeout": 0.1}))
    turn_id = await view.parts.start_turn(view.session)
    async with asyncio.timeout(5):
        with pytest.raises(WaitTimeout) as caught:
            await capped.wait(ALICE, SID, turn_id, timeout=3600)
    assert caught.value.details["timeout"] == 0.1


async def test_a_message_withdrawn_before_a_turn_took_it_ends_its_wait_with_409(view: View) -> None:
    await view.parts.start_turn(view.session)
    body = MessageCreate(content="later", delivery="queue")
    waiting = asyncio.create_task(
        view.turns.post_and_wait(ALICE, SID, body, idempotency_key=None, timeout=None)
    )
    deadline = asyncio.get_running_loop().time() + 5
    while not await view.parts.runner.queue(SID):
        assert asyncio.get_running_loop().time() < deadline, "the message was never stored"
        await asyncio.sleep(0.01)
    (queued,) = await view.parts.runner.withdraw(SID)
    with pytest.raises(Conflict) as caught:
        await asyncio.wait_for(waiting, 5)
    assert (caught.value.code, caught.value.details) == ("withdrawn", {"message_id": queued.id})
