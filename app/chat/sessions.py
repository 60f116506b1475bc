"""Chat sessions: create (idempotently), read, page, update and delete, each for the principal owning it."""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import re
from collections.abc import Sequence
from contextlib import aclosing

from app.chat.context import next_call
from app.chat.errors import InvalidCursor, SessionDeleted, UnknownModel, UnknownTool
from app.chat.idempotency import IdempotencyStore, fingerprint
from app.chat.stream_tokens import StreamTokens
from app.chat.tool_rules import check_approval, check_client_tools
from app.errors import InvalidRequest, NotFound, StorageUnavailable
from app.llm.gateway import ModelGateway
from app.llm.types import ModelRequest, TextPart
from app.protocol.clock import now_iso
from app.protocol.ids import SESSION_ID_PATTERN, new_session_id
from app.protocol.schemas import (
    ContextPolicy,
    ContextPolicyOut,
    SessionContext,
    SessionCreate,
    SessionOut,
    SessionPage,
    SessionUpdate,
    StreamToken,
    metadata_text,
)
from app.protocol.tool_requests import ClientTool, approval_names
from app.settings import Settings
from app.storage import repository
from app.storage.blobs import Blobs
from app.storage.engine import Database
from app.storage.tables import ChatSessionRow
from app.tools.registry import ToolRegistry
from app.turns.context.compactor import resolve_policy
from app.turns.control import TurnControl
from app.turns.live import LiveStatus

log = logging.getLogger("parley")
_SESSION_ID = re.compile(SESSION_ID_PATTERN)
_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+[+-][0-9]{2}:[0-9]{2}")


class Sessions:
    def __init__(
        self,
        settings: Settings,
        database: Database,
        turns: TurnControl,
        models: ModelGateway,
        tools: ToolRegistry,
        idempotency: IdempotencyStore,
        stream_tokens: StreamTokens,
        blobs: Blobs,
    ) -> None:
        self._stream_tokens = stream_tokens
        self._blobs = blobs
        self._settings = settings
        self._database = database
        self._turns = turns
        self._models = models
        self._tools = tools
        self._idempotency = idempotency
        self._titling: set[asyncio.Task[None]] = set()

    async def storage_ready(self) -> bool:
        """Whether the database answers now (for /readyz: PostgreSQL may be out of reach)."""
        return await self._database.ping()

    async def create(
        self, principal: str, body: SessionCreate, *, idempotency_key: str | None = None
    ) -> tuple[SessionOut, bool]:
        """The session, and whether it is the replayed answer of an earlier request with the same key."""
        if idempotency_key is None:
            return await self._create(principal, body, new_session_id()), False
        # Fields left out are left out of the fingerprint, so keys stored before they existed still match.
        absent = {
            name
            for name in ("client_tools", "approval", "context", "metadata")
            if getattr(body, name) is None
        }
        request = fingerprint("POST", "/v1/sessions", body.model_dump(mode="json", exclude=absent))

        async def find(session_id: str) -> SessionOut | None:
            async with self._database.read() as db:
                row = await repository.owned_session(db, principal, session_id)
            return await self._view(row) if row is not None else None

        async def create(session_id: str) -> SessionOut:
            return await self._create(principal, body, session_id)

        session, replayed = await self._idempotency.once(
            principal,
            idempotency_key,
            request,
            new_session_id,
            find=find,
            create=create,
            load=SessionOut.model_validate,
            status_code=201,
        )
        if replayed and (await find(session.id) is None or self._turns.is_closed(session.id)):
            raise SessionDeleted(
                f"The session this Idempotency-Key created ({session.id}) has been deleted; use a new key "
                "to create another.",
                details={"session_id": session.id},
            )
        return session, replayed

    async def _create(self, principal: str, body: SessionCreate, session_id: str) -> SessionOut:
        model = body.model or self._settings.default_model
        window = await self._check_model(model)
        tools = list(dict.fromkeys(body.tools)) if body.tools is not None else self._tools.builtin_names()
        self._check_tools(tools)
        client_tools = [t.model_dump(mode="json") for t in body.client_tools or []]
        approval = approval_names(body.approval)
        check_client_tools(tools, body.client_tools or [])
        check_approval(approval, tools, self._tools)
        at = now_iso()
        row = ChatSessionRow(
            id=session_id,
            principal=principal,
            title=body.title,
            model=model,
            system_prompt=body.system_prompt,
            tools=tools,
            client_tools=client_tools,
            approval=approval,
            created_at=at,
            updated_at=at,
            context_window=window,
            context=_policy(self._settings, None, body.context),
            session_metadata=body.metadata or {},
        )
        async with self._database.session() as db:
            await repository.insert_session(db, row, new_session_id)
            await repository.set_session_metadata(db, row.id, _entries(row.session_metadata))
            await db.commit()
        return await self._view(row)

    async def _check_model(self, model: str) -> int | None:
        if not await self._models.is_known(model):
            raise UnknownModel(
                f"Unknown model {model!r}. GET /v1/models lists the configured models.",
                details={"model": model},
            )
        return await self._models.context_window(model)

    def _check_tools(self, names: list[str]) -> None:
        unknown = self._tools.unknown(names)
        if unknown:
            raise UnknownTool(
                f"Unknown tool(s): {', '.join(unknown)}. Available: {', '.join(self._tools.names())}.",
                details={"unknown": unknown, "available": self._tools.names()},
            )

    async def owned(self, principal: str, session_id: str) -> ChatSessionRow:
        """The session, if `principal` owns it; 404 otherwise, so another principal's sessions stay unseen.
        A session being deleted is already gone."""
        async with self._database.read() as db:
            row = await repository.owned_session(db, principal, session_id)
        if row is None or self._turns.is_closed(session_id):
            raise NotFound(f"No session {session_id!r}.", details={"session_id": session_id})
        return row

    async def get(self, principal: str, session_id: str) -> SessionOut:
        return await self._view(await self.owned(principal, session_id))

    async def page(
        self, principal: str, limit: int, cursor: str | None, metadata: Sequence[tuple[str, str]] = ()
    ) -> SessionPage:
        """A page of the principal's sessions; `metadata`: the top-level entries each must hold, as
        `metadata_text` writes their values."""
        before = _decode_cursor(cursor) if cursor else None
        wanted = sorted(set(metadata))
        async with self._database.read() as db:
            rows = await repository.list_sessions(
                db, principal, limit=limit + 1, before=before, metadata=wanted
            )
        more = len(rows) > limit
        rows = rows[:limit]
        next_cursor = _encode_cursor(rows[-1].created_at, rows[-1].id) if more and rows else None
        statuses = await self._turns.statuses([r.id for r in rows])
        sessions = [_out(r, statuses[r.id], self._settings) for r in rows]
        return SessionPage(sessions=sessions, next_cursor=next_cursor)

    async def update(self, principal: str, session_id: str, body: SessionUpdate) -> SessionOut:
        current = await self.owned(principal, session_id)
        values = body.model_dump(exclude_unset=True)
        entries = None
        if "metadata" in values:
            values["session_metadata"] = values.pop("metadata") or {}
            entries = _entries(values["session_metadata"])
        if "model" in values:
            if values["model"] is None:
                raise InvalidRequest("body.model", "model cannot be null", "not_null")
            values["context_window"] = await self._check_model(values["model"])
        if "context" in values:
            if body.context is None:
                raise InvalidRequest("body.context", "context cannot be null", "not_null")
            values["context"] = _policy(self._settings, current.context, body.context)
        if values:
            values["updated_at"] = now_iso()
            async with self._database.session() as db:
                await repository.update_session(db, session_id, values)
                if entries is not None:
                    await repository.set_session_metadata(db, session_id, entries)
                await db.commit()
        return await self.get(principal, session_id)

    async def context(self, principal: str, session_id: str) -> SessionContext:
        """What the session's next model call would send (chat.context)."""
        row = await self.owned(principal, session_id)
        return await next_call(self._settings, self._database, self._blobs, self._models, row)

    async def stream_token(self, principal: str, session_id: str) -> StreamToken:
        """A token that opens this session's event stream, for its owner (404 for anyone else)."""
        await self.owned(principal, session_id)
        issued = await self._stream_tokens.issue(principal, session_id)
        return StreamToken(token=issued.token, expires_at=issued.expires_at)

    async def open_stream(self, token: str, session_id: str) -> str:
        """The principal a stream token of `session_id` was issued to, while it is valid (else 401)."""
        return await self._stream_tokens.open(token, session_id)

    async def title_from_message(self, session: ChatSessionRow, content: str) -> None:
        """A session without a title takes its first message's first line (at most TITLE_CHARS)."""
        if session.title is not None:
            return
        title = first_line_title(content)
        if not title:
            return
        try:
            async with self._database.session() as db:
                await repository.title_untitled(db, session.id, title, now_iso())
                await db.commit()
        except StorageUnavailable as exc:
            # The message is in: its answer stands, and the next message titles the session.
            log.warning("session %s: no title from its first message: %s", session.id, exc.code)
        if self._settings.title_model is not None:
            task = asyncio.create_task(self._model_title(session.id, title, content))
            self._titling.add(task)
            task.add_done_callback(self._titling.discard)

    async def _model_title(self, session_id: str, first_line: str, content: str) -> None:
        """PARLEY_TITLE_MODEL's title for the session, in place of its first line unless that was changed
        meanwhile. Best effort: a failure leaves the first line and is logged."""
        name = self._settings.title_model
        assert name is not None
        try:
            model = await self._models.resolve(name)
            adapter = await self._models.observed_adapter(model)
            messages = [
                {"role": "system", "content": TITLE_INSTRUCTION},
                {"role": "user", "content": content[:TITLE_SOURCE_CHARS]},
            ]
            request = ModelRequest(model, messages, [], self._settings.provider_timeout)
            text: list[str] = []
            async with aclosing(adapter.stream(request)) as stream:
                async for part in stream:
                    if isinstance(part, TextPart):
                        text.append(part.text)
            title = first_line_title("".join(text).strip().strip('"').strip())
            if not title:
                return
            async with self._database.session() as db:
                await repository.retitle(db, session_id, first_line, title, now_iso())
                await db.commit()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a title is never worth a failure: the first line stays
            log.warning("session %s: the title model failed: %s", session_id, type(exc).__name__)

    async def close(self) -> None:
        """Cancels the titles still being written (at shutdown)."""
        for task in list(self._titling):
            task.cancel()
        await asyncio.gather(*self._titling, return_exceptions=True)

    async def delete(self, principal: str, session_id: str) -> None:
        await self.owned(principal, session_id)
        await self._turns.delete_session(session_id)

    async def _view(self, row: ChatSessionRow) -> SessionOut:
        return _out(row, (await self._turns.statuses([row.id]))[row.id], self._settings)


def _policy(settings: Settings, stored: object, given: ContextPolicy | None) -> dict[str, object]:
    """The policy to store: the one stored (or the settings' defaults) with the given fields over it."""
    policy = resolve_policy(stored, settings)
    values: dict[str, object] = {
        "strategy": policy.strategy,
        "keep_turns": policy.keep_turns,
        "reserve_tokens": policy.reserve_tokens,
    }
    if given is not None:
        values |= given.model_dump(exclude_none=True)
    return values


def _out(row: ChatSessionRow, live: LiveStatus, settings: Settings) -> SessionOut:
    return SessionOut(
        id=row.id,
        title=row.title,
        model=row.model,
        system_prompt=row.system_prompt,
        tools=list(row.tools),
        client_tools=[ClientTool.model_validate(t) for t in row.client_tools],
        approval=list(row.approval),
        status=row.status,
        agent_status=live.agent_status,
        running_turn_id=live.turn_id,
        created_at=row.created_at,
        updated_at=row.updated_at,
        total_tokens=row.total_tokens,
        context_used=row.context_used,
        context_window=row.context_window,
        context=ContextPolicyOut.model_validate(_policy(settings, row.context, None)),
        metadata=dict(row.session_metadata or {}),
    )


TITLE_CHARS = 80
TITLE_SOURCE_CHARS = 4000
TITLE_INSTRUCTION = (
    "Write a short title (at most six words) for a conversation that starts with the user's message below. "
    "Answer with the title only: no quotes, no final period."
)


def first_line_title(content: str) -> str:
    """The first line with text, cut to TITLE_CHARS characters (an ellipsis ends a cut one)."""
    line = next((part.strip() for part in content.splitlines() if part.strip()), "")
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "\u2026"


def _entries(metadata: dict[str, str | bool | int | float]) -> list[tuple[str, str]]:
    return [(key, metadata_text(value)) for key, value in metadata.items()]


def _encode_cursor(created_at: str, session_id: str) -> str:
    return base64.urlsafe_b64encode(f"{created_at}|{session_id}".encode()).decode()


def _decode_cursor(cursor: str) -> tuple[str, str]:
    """The position a `next_cursor` names; 422 for a string this server did not make."""
    try:
        created_at, session_id = base64.urlsafe_b64decode(cursor.encode()).decode().split("|", 1)
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise InvalidCursor("The cursor is not valid.", details={"cursor": cursor[:100]}) from exc
    if not (_SESSION_ID.fullmatch(session_id) and _TIMESTAMP.fullmatch(created_at)):
        raise InvalidCursor("The cursor is not valid.", details={"cursor": cursor[:100]})
    return created_at, session_id
