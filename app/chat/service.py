"""Use cases behind the routes: sessions, messages, history, stop. SQL stays in repository."""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from sqlmodel.ext.asyncio.session import AsyncSession

from app.chat.idempotency import Idempotency, check_key, fingerprint
from app.errors import (
    ApiError,
    Conflict,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    Unavailable,
    WaitTimeout,
)
from app.llm.layer import ModelLayer
from app.protocol.clock import now_iso
from app.protocol.ids import new_message_id, new_session_id
from app.protocol.schemas import (
    AssistantTextMessage,
    CancelResult,
    ChatMessage,
    ErrorMessage,
    MessageAccepted,
    MessageCreate,
    MessagePage,
    ModelInfo,
    ModelList,
    QueuedMessage,
    QueueList,
    SessionCreate,
    SessionOut,
    SessionPage,
    SessionUpdate,
    ToolGroupMessage,
    TurnDoneMessage,
    TurnStartMessage,
    UserTextMessage,
)
from app.settings import DEMO_MODEL, Settings
from app.storage import repository
from app.storage.engine import Database
from app.storage.tables import ChatMessageRow, ChatSessionRow
from app.streaming.broker import Broker
from app.streaming.writer import WriteBehind
from app.tools.registry import ToolRegistry
from app.turns.runner import (
    NotWaiting,
    Runner,
    SessionClosed,
    ShuttingDown,
    TurnRunning,
    accepted,
    queued_message,
)


class UnknownModel(ApiError):
    code = "unknown_model"


class UnknownTool(ApiError):
    code = "unknown_tool"


class InvalidCursor(ApiError):
    code = "invalid_cursor"


class ChatService:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        runner: Runner,
        models: ModelLayer,
        tools: ToolRegistry,
        broker: Broker,
        writer: WriteBehind,
    ) -> None:
        self._settings = settings
        self._db = db
        self._runner = runner
        self._models = models
        self._tools = tools
        self._broker = broker
        self._writer = writer
        self._idempotency = Idempotency(db, ttl_seconds=settings.idempotency_ttl_hours * 3600)

    # --- sessions ------------------------------------------------------------------------------------

    async def _check_model(self, model: str) -> int | None:
        if not await self._models.is_known(model):
            raise UnknownModel(
                f"Unknown model {model!r}. GET /v1/models lists the configured models.",
                details={"model": model},
            )
        return await self._models.context_window(model)

    def _check_tools(self, names: list[str]) -> None:
        unknown = [n for n in names if self._tools.get(n) is None]
        if unknown:
            raise UnknownTool(
                f"Unknown tool(s): {', '.join(unknown)}. Available: {', '.join(self._tools.names())}.",
                details={"unknown": unknown, "available": self._tools.names()},
            )

    async def create_session(
        self, principal: str, body: SessionCreate, *, idempotency_key: str | None = None
    ) -> tuple[SessionOut, bool]:
        """The session, and whether it is the replayed answer of an earlier request with the same key."""
        if idempotency_key is None:
            return await self._create_session(principal, body, new_session_id()), False
        request = fingerprint("POST", "/v1/sessions", body.model_dump(mode="json"))
        async with self._idempotency.reserve(
            principal, check_key(idempotency_key), request, new_session_id
        ) as res:
            if res.replay is not None:
                return SessionOut.model_validate(res.replay), True
            existing = await self._find_session(principal, res.resource_id) if res.resumed else None
            created = existing or await self._create_session(principal, body, res.resource_id)
            await self._idempotency.complete(res, 201, created.model_dump_json())
            return created, existing is not None

    async def _find_session(self, principal: str, session_id: str) -> SessionOut | None:
        async with self._db.session() as db:
            row = await repository.owned_session(db, principal, session_id)
        return self._out(row) if row is not None else None

    async def _create_session(self, principal: str, body: SessionCreate, session_id: str) -> SessionOut:
        model = body.model or self._settings.default_model
        window = await self._check_model(model)
        tools = list(dict.fromkeys(body.tools)) if body.tools is not None else self._tools.names()
        self._check_tools(tools)
        at = now_iso()
        row = ChatSessionRow(
            id=session_id,
            principal=principal,
            title=body.title,
            model=model,
            system_prompt=body.system_prompt,
            tools=tools,
            created_at=at,
            updated_at=at,
            context_window=window,
        )
        async with self._db.session() as db:
            db.add(row)
            await db.commit()
        return self._out(row)

    async def get_row(self, principal: str, session_id: str) -> ChatSessionRow:
        """The session, if `principal` owns it; 404 otherwise, so another principal's sessions stay unseen.
        A session being deleted is already gone."""
        async with self._db.session() as db:
            row = await repository.owned_session(db, principal, session_id)
        if row is None or self._runner.is_closed(session_id):
            raise NotFound(f"No session {session_id!r}.", details={"session_id": session_id})
        return row

    async def get_session(self, principal: str, session_id: str) -> SessionOut:
        return self._out(await self.get_row(principal, session_id))

    async def list_sessions(self, principal: str, limit: int, cursor: str | None) -> SessionPage:
        before = _decode_cursor(cursor) if cursor else None
        async with self._db.session() as db:
            rows = await repository.list_sessions(db, principal, limit=limit + 1, before=before)
        more = len(rows) > limit
        rows = rows[:limit]
        next_cursor = _encode_cursor(rows[-1].created_at, rows[-1].id) if more and rows else None
        return SessionPage(sessions=[self._out(r) for r in rows], next_cursor=next_cursor)

    async def update_session(self, principal: str, session_id: str, body: SessionUpdate) -> SessionOut:
        await self.get_row(principal, session_id)
        values = body.model_dump(exclude_unset=True)
        if "model" in values:
            if values["model"] is None:
                raise InvalidRequest("body.model", "model cannot be null", "not_null")
            values["context_window"] = await self._check_model(values["model"])
        if values:
            values["updated_at"] = now_iso()
            async with self._db.session() as db:
                await repository.update_session(db, session_id, values)
                await db.commit()
        return await self.get_session(principal, session_id)

    async def delete_session(self, principal: str, session_id: str) -> None:
        await self.get_row(principal, session_id)
        await self._runner.close_session(session_id)
        self._writer.forget_session(session_id)
        async with self._db.session() as db:
            await repository.delete_session(db, session_id)
            await db.commit()
        self._runner.forget(session_id)
        self._broker.drop(session_id)

    def _out(self, row: ChatSessionRow) -> SessionOut:
        live = self._runner.live(row.id)
        return SessionOut(
            id=row.id,
            title=row.title,
            model=row.model,
            system_prompt=row.system_prompt,
            tools=list(row.tools),
            status=row.status,
            agent_status=live.agent_status,
            running_turn_id=live.turn_id,
            created_at=row.created_at,
            updated_at=row.updated_at,
            total_tokens=row.total_tokens,
            context_used=row.context_used,
            context_window=row.context_window,
        )

    # --- messages ------------------------------------------------------------------------------------

    async def post_message(
        self, principal: str, session_id: str, body: MessageCreate, *, idempotency_key: str | None = None
    ) -> tuple[MessageAccepted, bool]:
        """The stored message, and whether it is the replayed answer of an earlier request with the key."""
        session = await self.get_row(principal, session_id)
        if len(body.content) > self._settings.max_message_chars:
            limit = self._settings.max_message_chars
            raise PayloadTooLarge(
                f"The message has {len(body.content)} characters; the limit is {limit}.",
                details={"field": "content", "limit": limit},
            )
        if idempotency_key is None:
            return await self._post(session, body, new_message_id()), False
        # An absent client_message_id is left out, so keys stored before the field existed still match.
        absent = {"client_message_id"} if body.client_message_id is None else None
        request_body = body.model_dump(mode="json", exclude=absent)
        request = fingerprint("POST", f"/v1/sessions/{session_id}/messages", request_body)
        async with self._idempotency.reserve(
            principal, check_key(idempotency_key), request, new_message_id
        ) as res:
            if res.replay is not None:
                return MessageAccepted.model_validate(res.replay), True
            existing = await self._find_message(session_id, res.resource_id) if res.resumed else None
            accepted = existing or await self._post(session, body, res.resource_id)
            await self._idempotency.complete(res, 202, accepted.model_dump_json())
            return accepted, existing is not None

    async def _find_message(self, session_id: str, message_id: str) -> MessageAccepted | None:
        """A message an earlier attempt stored before it could answer (it crashed in between)."""
        async with self._db.session() as db:
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
            )
            return accepted(session_id, taken, stored.turn_id)
        if waiting is not None and waiting.session_id == session_id:
            return accepted(session_id, queued_message(waiting), None)
        return None

    async def _post(self, session: ChatSessionRow, body: MessageCreate, message_id: str) -> MessageAccepted:
        session_id = session.id
        try:
            return await self._runner.post(
                session,
                body.content,
                body.sender,
                body.delivery,
                message_id=message_id,
                client_message_id=body.client_message_id,
            )
        except SessionClosed as exc:
            raise NotFound(f"No session {session_id!r}.", details={"session_id": session_id}) from exc
        except TurnRunning as exc:
            raise Conflict(
                f"A turn is running ({exc.turn_id}); the message was not stored.",
                code="turn_running",
                details={"turn_id": exc.turn_id},
            ) from exc
        except ShuttingDown as exc:
            raise Unavailable("The server is shutting down; retry on another instance.") from exc

    # --- waiting (?wait=true) ---------------------------------------------------------------------------

    def wait_seconds(self, timeout: float | None) -> float:
        """A wait's limit: the caller's `timeout`, capped by PARLEY_WAIT_TIMEOUT."""
        limit = self._settings.wait_timeout
        return limit if timeout is None else min(timeout, limit)

    @asynccontextmanager
    async def _within(
        self, timeout: float | None, timed_out: Callable[[float], WaitTimeout]
    ) -> AsyncIterator[None]:
        """The block under the wait's limit: past it, `timed_out(seconds)` is raised (a TimeoutError of
        the block's own stays one)."""
        seconds = self.wait_seconds(timeout)
        deadline = asyncio.timeout(seconds)
        try:
            async with deadline:
                yield
        except TimeoutError as exc:
            if not deadline.expired():
                raise
            raise timed_out(seconds) from exc

    async def await_message_turn(
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
                turn_id = await self._runner.taker(session_id, message.id)
                if turn_id is None:
                    raise await self._never_taken(principal, session_id, message.id)
            await self._runner.turn_end(turn_id)
        return turn_id

    async def _never_taken(self, principal: str, session_id: str, message_id: str) -> ApiError:
        if self._runner.closing:
            return Unavailable(
                "The server is shutting down; the message is kept and answered after the restart.",
                details={"message_id": message_id},
            )
        await self.get_row(principal, session_id)  # 404 once the session is deleted
        return Conflict(
            f"Message {message_id!r} was withdrawn before a turn took it.",
            code="withdrawn",
            details={"message_id": message_id},
        )

    async def await_turn_end(self, turn_id: str, timeout: float | None) -> None:
        """Returns once the turn has ended (at once if it is not running); 504 if the limit passes first."""

        def timed_out(seconds: float) -> WaitTimeout:
            return WaitTimeout(
                f"The turn did not end within {seconds:g} s; it goes on. Wait again, or follow the events.",
                details={"turn_id": turn_id, "message_id": None, "timeout": seconds},
            )

        async with self._within(timeout, timed_out):
            await self._runner.turn_end(turn_id)

    # --- stop and the waiting line -------------------------------------------------------------------

    async def cancel(self, principal: str, session_id: str, clear_queue: bool) -> CancelResult:
        await self.get_row(principal, session_id)
        return await self._runner.cancel(session_id, clear_queue=clear_queue)

    async def queue(self, principal: str, session_id: str) -> QueueList:
        await self.get_row(principal, session_id)
        return QueueList(queue=await self._runner.queue(session_id))

    async def withdraw(self, principal: str, session_id: str, message_id: str) -> QueuedMessage:
        await self.get_row(principal, session_id)
        try:
            [withdrawn] = await self._runner.withdraw(session_id, [message_id])
        except NotWaiting as exc:
            async with self._db.session() as db:
                taken = await repository.message_position(db, session_id, message_id)
            if taken is not None:
                raise Conflict(
                    f"Message {message_id!r} was already taken by a turn.",
                    code="already_taken",
                    details={"message_id": message_id},
                ) from exc
            raise NotFound(f"No waiting message {message_id!r}.", details={"message_id": message_id}) from exc
        return withdrawn

    async def history(
        self, principal: str, session_id: str, *, limit: int, after: str | None, before: str | None
    ) -> MessagePage:
        await self.get_row(principal, session_id)
        # Read before the rows: events published meanwhile come after it, so a client that subscribes
        # with after=last_event_id gets them; nothing falls in between.
        last_event_id = await self._broker.last_seq(session_id)
        async with self._db.session() as db:
            after_pos = await self._position(db, session_id, after) if after else None
            before_pos = await self._position(db, session_id, before) if before else None
            rows = await repository.list_messages(
                db, session_id, limit=limit + 1, after_position=after_pos, before_position=before_pos
            )
        if before_pos is not None:
            more = len(rows) > limit
            rows = rows[-limit:] if more else rows
            next_cursor = rows[0].id if more and rows else None
        else:
            more = len(rows) > limit
            rows = rows[:limit]
            next_cursor = rows[-1].id if more and rows else None
        return MessagePage(
            chat_messages=[to_chat_message(r) for r in rows],
            next_cursor=next_cursor,
            last_event_id=last_event_id,
        )

    @staticmethod
    async def _position(db: AsyncSession, session_id: str, message_id: str) -> int:
        position = await repository.message_position(db, session_id, message_id)
        if position is None:
            raise InvalidCursor(f"No message {message_id!r} in this session.", details={"cursor": message_id})
        return position

    # --- models --------------------------------------------------------------------------------------

    async def list_models(self) -> ModelList:
        infos = []
        for name in self._models.model_names():
            configured = self._models.catalog.get(name)
            infos.append(
                ModelInfo(
                    model=name,
                    provider=configured.provider
                    if configured
                    else ("parley" if name == DEMO_MODEL else None),
                    context_window=await self._models.context_window(name),
                    source="models_file" if configured else "demo",
                )
            )
        default = self._settings.default_model
        if default not in self._models.model_names():
            infos.append(
                ModelInfo(
                    model=default,
                    provider=None,
                    context_window=await self._models.context_window(default),
                    source="default",
                )
            )
        return ModelList(models=infos, default_model=default)


def to_chat_message(row: ChatMessageRow) -> ChatMessage:
    if row.type == "turn_start":
        return TurnStartMessage(id=row.id, turn_id=row.turn_id, timestamp=row.timestamp)
    if row.type == "turn_done":
        return TurnDoneMessage(
            id=row.id,
            turn_id=row.turn_id,
            timestamp=row.timestamp,
            duration_seconds=row.duration_seconds or 0.0,
            status=row.status or "completed",
        )
    if row.type == "tool_group":
        return ToolGroupMessage(
            id=row.id,
            tool_call_id=row.tool_call_id or "",
            tool_name=row.tool_name or "",
            arguments=row.arguments,
            result=row.result,
            is_error=row.is_error,
            timestamp=row.timestamp,
            duration_ms=row.duration_ms,
            model=row.model or "",
            interrupted=bool(row.interrupted),
        )
    if row.type == "error":
        return ErrorMessage(
            id=row.id,
            content=row.content or "",
            code=row.code or "error",
            timestamp=row.timestamp,
            model=row.model,
        )
    if row.role == "user":
        return UserTextMessage(
            id=row.id,
            content=row.content or "",
            timestamp=row.timestamp,
            sender=row.sender or "User",
            client_message_id=row.client_message_id,
        )
    return AssistantTextMessage(
        id=row.id,
        content=row.content or "",
        timestamp=row.timestamp,
        duration_ms=row.duration_ms,
        model=row.model or "",
        interrupted=bool(row.interrupted),
    )


def _encode_cursor(created_at: str, session_id: str) -> str:
    return base64.urlsafe_b64encode(f"{created_at}|{session_id}".encode()).decode()


def _decode_cursor(cursor: str) -> tuple[str, str]:
    try:
        created_at, session_id = base64.urlsafe_b64decode(cursor.encode()).decode().split("|", 1)
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise InvalidCursor("The cursor is not valid.", details={"cursor": cursor}) from exc
    return created_at, session_id
