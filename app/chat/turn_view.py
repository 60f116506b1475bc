"""The turn view: a session's turns (chat.views groups them), and `?wait=true`: a script gets a turn once
it has ended, the turn that takes a message it posts (`post_and_wait`) or a turn it knows by id (`wait`),
read after its turn_done has committed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from app.chat.errors import InvalidCursor, Withdrawn
from app.chat.messages import Messages
from app.chat.sessions import Sessions
from app.chat.views import build_turns, parents_of
from app.errors import DomainError, NotFound, Unavailable, WaitTimeout
from app.protocol.schemas import MessageAccepted, MessageCreate
from app.protocol.turns import Turn, TurnPage
from app.settings import Settings
from app.storage import compaction, turn_queries, turn_tree
from app.storage.engine import Database
from app.turns.control import TurnControl


class Turns:
    def __init__(
        self,
        settings: Settings,
        database: Database,
        sessions: Sessions,
        messages: Messages,
        turns: TurnControl,
    ) -> None:
        self._settings = settings
        self._database = database
        self._sessions = sessions
        self._messages = messages
        self._turns = turns

    async def page(self, principal: str, session_id: str, *, limit: int, before: str | None) -> TurnPage:
        """The session's `limit` newest turns, or the ones just before the turn `before`."""
        await self._sessions.owned(principal, session_id)
        async with self._database.read() as db:
            before_position = None
            if before is not None:
                before_position = await turn_queries.turn_position(db, session_id, before)
                if before_position is None:
                    raise InvalidCursor(f"No turn {before!r} in this session.", details={"cursor": before})
            turn_ids = await turn_queries.latest_turn_ids(
                db, session_id, limit=limit + 1, before_position=before_position
            )
            rows = await turn_queries.messages_of_turns(db, session_id, turn_ids[:limit])
            children = await turn_tree.siblings(db, session_id, parents_of(rows))
            views = await compaction.views_of_turns(db, turn_ids[:limit])
        turns = build_turns(rows, children, views)
        more = len(turn_ids) > limit
        return TurnPage(turns=turns, next_cursor=turns[0].turn_id if more and turns else None)

    async def get(self, principal: str, session_id: str, turn_id: str) -> Turn:
        await self._sessions.owned(principal, session_id)
        async with self._database.read() as db:
            rows = await turn_queries.messages_of_turns(db, session_id, [turn_id])
            children = await turn_tree.siblings(db, session_id, parents_of(rows)) if rows else {}
            views = await compaction.views_of_turns(db, [turn_id]) if rows else []
        if not rows:
            raise NotFound(
                f"No turn {turn_id!r} in session {session_id!r}.",
                details={"session_id": session_id, "turn_id": turn_id},
            )
        return build_turns(rows, children, views)[0]

    async def post_and_wait(
        self,
        principal: str,
        session_id: str,
        body: MessageCreate,
        *,
        idempotency_key: str | None,
        timeout: float | None,
    ) -> tuple[Turn, bool]:
        """Stores the message as a plain post does, then waits for the end of the turn that takes it.

        Returns that turn, and whether the message is an idempotent replay (a retry then waits for the same
        message's turn). Cancelling this while the message is stored finishes the storing anyway.
        """
        accepted, replayed = await asyncio.shield(
            self._messages.post(principal, session_id, body, idempotency_key=idempotency_key)
        )
        turn_id = await self._message_turn_end(principal, session_id, accepted, timeout)
        return await self.get(principal, session_id, turn_id), replayed

    async def wait(self, principal: str, session_id: str, turn_id: str, *, timeout: float | None) -> Turn:
        """The turn once it has ended (at once when it already has); 504 if the limit passes first."""
        turn = await self.get(principal, session_id, turn_id)
        if turn.status != "running":
            return turn

        def timed_out(seconds: float) -> WaitTimeout:
            return WaitTimeout(
                f"The turn did not end within {seconds:g} s; it goes on. Wait again, or follow the events.",
                details={"turn_id": turn_id, "message_id": None, "timeout": seconds},
            )

        async with self._within(timeout, timed_out):
            await self._turns.turn_end(turn_id)
        return await self.get(principal, session_id, turn_id)

    # --- waiting ---------------------------------------------------------------------------------------

    @asynccontextmanager
    async def _within(
        self, timeout: float | None, timed_out: Callable[[float], WaitTimeout]
    ) -> AsyncIterator[None]:
        """The block under the wait's limit (the caller's `timeout`, capped by PARLEY_WAIT_TIMEOUT): past
        it, `timed_out(seconds)` is raised (a TimeoutError of the block's own stays one)."""
        limit = self._settings.wait_timeout
        seconds = limit if timeout is None else min(timeout, limit)
        deadline = asyncio.timeout(seconds)
        try:
            async with deadline:
                yield
        except TimeoutError as exc:
            if not deadline.expired():
                raise
            raise timed_out(seconds) from exc

    async def _message_turn_end(
        self, principal: str, session_id: str, message: MessageAccepted, timeout: float | None
    ) -> str:
        """The id of the turn that took the stored message, once that turn has ended; one limit for both
        waits. Cancelling this (the client left) stops the wait, never the turn."""
        turn_id = message.turn_id

        def timed_out(seconds: float) -> WaitTimeout:
            return WaitTimeout(
                f"No turn ended within {seconds:g} s; the message is kept and its turn goes on. Wait "
                "again with GET .../turns/{turn_id}?wait=true once turn_id is known (it is null while "
                "the message waits for a turn).",
                details={"turn_id": turn_id, "message_id": message.id, "timeout": seconds},
            )

        async with self._within(timeout, timed_out):
            if turn_id is None:
                turn_id = await self._turns.taker(session_id, message.id)
                if turn_id is None:
                    raise await self._never_taken(principal, session_id, message.id)
            await self._turns.turn_end(turn_id)
        return turn_id

    async def _never_taken(self, principal: str, session_id: str, message_id: str) -> DomainError:
        if self._turns.closing:
            return Unavailable(
                "The server is shutting down; the message is kept and answered after the restart.",
                details={"message_id": message_id},
            )
        await self._sessions.owned(principal, session_id)  # 404 once the session is deleted
        return Withdrawn(
            f"Message {message_id!r} was withdrawn before a turn took it.",
            details={"message_id": message_id},
        )
