"""Messages: post (idempotently), page the history, stop the running turn, and the waiting line."""

from __future__ import annotations

from sqlmodel.ext.asyncio.session import AsyncSession

from app.chat.errors import AlreadyTaken, InvalidCursor, TurnInProgress
from app.chat.files import Files
from app.chat.idempotency import IdempotencyStore, fingerprint
from app.chat.sessions import Sessions
from app.chat.tool_rules import check_client_tools
from app.chat.views import to_chat_message
from app.errors import NotFound, PayloadTooLarge, Unavailable
from app.protocol.ids import new_message_id
from app.protocol.schemas import (
    CancelResult,
    MessageAccepted,
    MessageCreate,
    MessagePage,
    QueuedMessage,
    QueueList,
)
from app.settings import Settings
from app.storage import repository
from app.storage.engine import Database
from app.storage.tables import ChatSessionRow
from app.streaming.broker import EventFanOut
from app.turns.control import (
    NotWaiting,
    SessionClosed,
    ShuttingDown,
    TurnControl,
    TurnRunning,
    accepted,
    queued_message,
)


class Messages:
    def __init__(
        self,
        settings: Settings,
        database: Database,
        sessions: Sessions,
        turns: TurnControl,
        fanout: EventFanOut,
        idempotency: IdempotencyStore,
        files: Files,
    ) -> None:
        self._settings = settings
        self._database = database
        self._sessions = sessions
        self._turns = turns
        self._fanout = fanout
        self._idempotency = idempotency
        self._files = files

    async def post(
        self,
        principal: str,
        session_id: str,
        body: MessageCreate,
        *,
        idempotency_key: str | None = None,
        note: str | None = None,
    ) -> tuple[MessageAccepted, bool]:
        """The stored message, and whether it is the replayed answer of an earlier request with the key.
        `note`: what a frontend tells the model for the turn that takes the message (AG-UI's context),
        joined to that turn's system prompt and not stored."""
        session = await self._sessions.owned(principal, session_id)
        if len(body.content) > self._settings.max_message_chars:
            limit = self._settings.max_message_chars
            raise PayloadTooLarge(
                f"The message has {len(body.content)} characters; the limit is {limit}.",
                details={"field": "content", "limit": limit},
            )
        if idempotency_key is None:
            return await self._post(session, body, new_message_id(), note), False
        # An absent client_message_id is left out, so keys stored before the field existed still match.
        absent = {
            name
            for name in ("client_message_id", "client_tools", "attachments")
            if getattr(body, name) is None
        }
        request_body = body.model_dump(mode="json", exclude=absent)
        request = fingerprint("POST", f"/v1/sessions/{session_id}/messages", request_body)

        async def find(message_id: str) -> MessageAccepted | None:
            return await self._find(session_id, message_id)

        async def create(message_id: str) -> MessageAccepted:
            return await self._post(session, body, message_id, note)

        return await self._idempotency.once(
            principal,
            idempotency_key,
            request,
            new_message_id,
            find=find,
            create=create,
            load=MessageAccepted.model_validate,
            status_code=202,
        )

    async def _find(self, session_id: str, message_id: str) -> MessageAccepted | None:
        """A message an earlier attempt stored before it could answer (it crashed in between)."""
        async with self._database.read() as db:
            stored = await repository.get_message(db, message_id)
            waiting = await repository.get_queued(db, message_id) if stored is None else None
        if stored is not None and stored.session_id == session_id:
            taken = QueuedMessage(
                id=stored.id,
                content=stored.content or "",
                sender=stored.sender or "User",
                client_message_id=stored.client_message_id,
                timestamp=stored.timestamp,
                delivery="steer",
                attachments=stored.attachments,
            )
            return accepted(session_id, taken, stored.turn_id)
        if waiting is not None and waiting.session_id == session_id:
            return accepted(session_id, queued_message(waiting), None)
        return None

    async def _post(
        self, session: ChatSessionRow, body: MessageCreate, message_id: str, note: str | None
    ) -> MessageAccepted:
        session_id = session.id
        check_client_tools(session.tools, body.client_tools or [])
        # Checked (count, owner, type, what the model takes) before anything is stored; data URLs become
        # files, taken back if the message is refused after all.
        attachments, created = await self._files.attach(
            session.principal, session.model, body.attachments or []
        )
        try:
            answer = await self._turns.post(
                session,
                body.content,
                body.sender,
                body.delivery,
                message_id=message_id,
                client_message_id=body.client_message_id,
                client_tools=body.client_tools,
                attachments=attachments,
                note=note,
            )
        except SessionClosed as exc:
            await self._files.discard(session.principal, created)
            raise NotFound(f"No session {session_id!r}.", details={"session_id": session_id}) from exc
        except TurnRunning as exc:
            await self._files.discard(session.principal, created)
            raise TurnInProgress(
                f"A turn is running ({exc.turn_id}); the message was not stored.",
                details={"turn_id": exc.turn_id},
            ) from exc
        except ShuttingDown as exc:
            await self._files.discard(session.principal, created)
            raise Unavailable("The server is shutting down; retry on another instance.") from exc
        await self._sessions.title_from_message(session, body.content)
        return answer

    # --- stop and the waiting line -------------------------------------------------------------------

    async def cancel(self, principal: str, session_id: str, clear_queue: bool) -> CancelResult:
        await self._sessions.owned(principal, session_id)
        return await self._turns.cancel(session_id, clear_queue=clear_queue)

    async def queue(self, principal: str, session_id: str) -> QueueList:
        await self._sessions.owned(principal, session_id)
        return QueueList(queue=await self._turns.queue(session_id))

    async def withdraw(self, principal: str, session_id: str, message_id: str) -> QueuedMessage:
        await self._sessions.owned(principal, session_id)
        try:
            [withdrawn] = await self._turns.withdraw(session_id, [message_id])
        except NotWaiting as exc:
            async with self._database.read() as db:
                taken = await repository.message_position(db, session_id, message_id)
            if taken is not None:
                raise AlreadyTaken(
                    f"Message {message_id!r} was already taken by a turn.",
                    details={"message_id": message_id},
                ) from exc
            raise NotFound(f"No waiting message {message_id!r}.", details={"message_id": message_id}) from exc
        return withdrawn

    # --- history -------------------------------------------------------------------------------------

    async def history(
        self, principal: str, session_id: str, *, limit: int, after: str | None, before: str | None
    ) -> MessagePage:
        await self._sessions.owned(principal, session_id)
        # Read before the rows: events published meanwhile come after it, so a client that subscribes
        # with after=last_event_id gets them; nothing falls in between.
        last_event_id = await self._fanout.last_seq(session_id)
        after, before = after or None, before or None
        async with self._database.read() as db:
            rows = await repository.page_messages(
                db, session_id, limit=limit + 1, after_id=after, before_id=before
            )
            if not rows:  # an empty page, or a cursor that names no message of the session
                for cursor in (after, before):
                    if cursor is not None:
                        await _position(db, session_id, cursor)
        more = len(rows) > limit
        if before is not None:
            rows = rows[-limit:] if more else rows
            next_cursor = rows[0].id if more and rows else None
        else:
            rows = rows[:limit]
            next_cursor = rows[-1].id if more and rows else None
        return MessagePage(
            chat_messages=[to_chat_message(r) for r in rows],
            next_cursor=next_cursor,
            last_event_id=last_event_id,
        )


async def _position(db: AsyncSession, session_id: str, message_id: str) -> int:
    position = await repository.message_position(db, session_id, message_id)
    if position is None:
        raise InvalidCursor(f"No message {message_id!r} in this session.", details={"cursor": message_id})
    return position
