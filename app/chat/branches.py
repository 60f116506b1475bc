"""Branches (docs/protocol.md, Branches): regenerate an answer, edit an earlier message, switch the active
path, fork a session. Each is idempotent with an Idempotency-Key; regenerate, edit and activate refuse
while a turn runs (409) unless `delivery: interrupt` stops it first; another principal's ids are 404."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from app.chat.errors import TurnInProgress, UnknownModel
from app.chat.files import Files
from app.chat.idempotency import IdempotencyStore, fingerprint
from app.chat.sessions import Sessions
from app.chat.tool_rules import check_client_tools
from app.errors import NotFound, PayloadTooLarge, Unavailable
from app.llm.gateway import ModelGateway
from app.observability.hooks import branch_operation
from app.protocol.branches import (
    ActivateRequest,
    ActivePath,
    BranchDelivery,
    BranchTurn,
    EditRequest,
    ForkRequest,
    RegenerateRequest,
)
from app.protocol.clock import now_iso
from app.protocol.files import Attachment
from app.protocol.ids import new_message_id, new_session_id, new_turn_id
from app.protocol.schemas import QueuedMessage, SessionOut, metadata_text
from app.protocol.tool_requests import ClientTool
from app.settings import Settings
from app.storage import repository, turn_queries, turn_tree
from app.storage.engine import Database
from app.storage.tables import ChatMessageRow, ChatSessionRow, new_message
from app.turns.control import SessionClosed, ShuttingDown, TurnControl, TurnRunning


class Branches:
    def __init__(
        self,
        settings: Settings,
        database: Database,
        sessions: Sessions,
        turns: TurnControl,
        models: ModelGateway,
        idempotency: IdempotencyStore,
        files: Files,
    ) -> None:
        self._settings = settings
        self._database = database
        self._sessions = sessions
        self._turns = turns
        self._models = models
        self._idempotency = idempotency
        self._files = files

    # --- regenerate and edit: a new turn beside another --------------------------------------------------

    async def regenerate(
        self,
        principal: str,
        session_id: str,
        turn_id: str,
        body: RegenerateRequest,
        *,
        idempotency_key: str | None = None,
    ) -> tuple[BranchTurn, bool]:
        """A new turn answering `turn_id`'s user input again (its messages, the same parent)."""
        session = await self._sessions.owned(principal, session_id)
        parent = await self._parent(session_id, turn_id)
        if body.model is not None and body.model != session.model:
            if not await self._models.is_known(body.model):
                raise UnknownModel(
                    f"Unknown model {body.model!r}. GET /v1/models lists the configured models.",
                    details={"model": body.model},
                )
            session = _with_model(session, body.model)

        async def create(new_id: str) -> BranchTurn:
            async with self._database.read() as db:
                rows = await repository.turn_messages(db, turn_id)
            messages = [_again(row) for row in rows if row.type == "text" and row.role == "user"]
            # Its files go again, to a model that may be another one: it must take them (422 otherwise).
            await self._files.check_model(
                session.model, [a.media_type for m in messages for a in m.attachments or []]
            )
            return await self._branch(session, turn_id, parent, messages, new_id, body.delivery, "regenerate")

        path = f"/v1/sessions/{session_id}/turns/{turn_id}/regenerate"
        request = body.model_dump(mode="json")
        return await self._once(principal, idempotency_key, path, request, session_id, turn_id, create)

    async def edit(
        self,
        principal: str,
        session_id: str,
        turn_id: str,
        body: EditRequest,
        *,
        idempotency_key: str | None = None,
    ) -> tuple[BranchTurn, bool]:
        """A new turn beside `turn_id` whose user message is the edited one."""
        session = await self._sessions.owned(principal, session_id)
        if len(body.content) > self._settings.max_message_chars:
            limit = self._settings.max_message_chars
            raise PayloadTooLarge(
                f"The message has {len(body.content)} characters; the limit is {limit}.",
                details={"field": "content", "limit": limit},
            )
        check_client_tools(session.tools, body.client_tools or [])
        parent = await self._parent(session_id, turn_id)

        async def create(new_id: str) -> BranchTurn:
            # Checked as a posted message's are, before anything is stored (chat.messages); data URLs
            # become files, taken back if the edit is refused after all.
            attachments, created = await self._files.attach(
                session.principal, session.model, body.attachments or []
            )
            message = QueuedMessage(
                id=new_message_id(),
                content=body.content,
                sender=body.sender,
                client_message_id=body.client_message_id,
                timestamp=now_iso(),
                delivery="steer",
                client_tools=body.client_tools,
                attachments=attachments or None,
            )
            try:
                return await self._branch(session, turn_id, parent, [message], new_id, body.delivery, "edit")
            except BaseException:
                await self._files.discard(session.principal, created)
                raise

        absent = {
            name
            for name in ("client_message_id", "client_tools", "attachments")
            if getattr(body, name) is None
        }
        request = body.model_dump(mode="json", exclude=absent)
        path = f"/v1/sessions/{session_id}/turns/{turn_id}/edit"
        return await self._once(principal, idempotency_key, path, request, session_id, turn_id, create)

    async def _branch(
        self,
        session: ChatSessionRow,
        sibling_of: str,
        parent: str | None,
        messages: list[QueuedMessage],
        new_id: str,
        delivery: BranchDelivery,
        operation: str,
    ) -> BranchTurn:
        await self._stop_first(session.id, delivery)
        try:
            opened = await self._turns.branch(session, messages, parent, turn_id=new_id)
        except TurnRunning as exc:
            raise _running(exc) from exc
        except SessionClosed as exc:
            raise NotFound(f"No session {session.id!r}.", details={"session_id": session.id}) from exc
        except ShuttingDown as exc:
            raise Unavailable("The server is shutting down; retry on another instance.") from exc
        branch_operation(operation)
        return BranchTurn(
            session_id=session.id,
            turn_id=opened,
            parent_turn_id=parent,
            sibling_of=sibling_of,
            user_message_ids=[m.id for m in messages],
        )

    async def _once(
        self,
        principal: str,
        key: str | None,
        path: str,
        request: object,
        session_id: str,
        sibling_of: str,
        create: Callable[[str], Awaitable[BranchTurn]],
    ) -> tuple[BranchTurn, bool]:
        if key is None:
            return await create(new_turn_id()), False

        async def find(new_id: str) -> BranchTurn | None:
            """The turn an earlier attempt opened with the reserved id before it could answer."""
            async with self._database.read() as db:
                rows = await turn_queries.messages_of_turns(db, session_id, [new_id])
            starts = [row for row in rows if row.type == "turn_start"]
            if not starts:
                return None
            return BranchTurn(
                session_id=session_id,
                turn_id=new_id,
                parent_turn_id=starts[0].parent_turn_id,
                sibling_of=sibling_of,
                user_message_ids=[row.id for row in rows if row.type == "text" and row.role == "user"],
            )

        return await self._idempotency.once(
            principal,
            key,
            fingerprint("POST", path, request),
            new_turn_id,
            find=find,
            create=create,
            load=BranchTurn.model_validate,
            status_code=202,
        )

    # --- activate: switch the active path ----------------------------------------------------------------

    async def activate(
        self,
        principal: str,
        session_id: str,
        turn_id: str,
        body: ActivateRequest,
        *,
        idempotency_key: str | None = None,
    ) -> tuple[ActivePath, bool]:
        """The active path becomes the one through `turn_id`, down to the most recent turn under it."""
        await self._sessions.owned(principal, session_id)
        await self._parent(session_id, turn_id)

        async def create(_: str) -> ActivePath:
            await self._stop_first(session_id, body.delivery)
            try:
                head, path = await self._turns.activate(session_id, turn_id)
            except TurnRunning as exc:
                raise _running(exc) from exc
            except SessionClosed as exc:
                raise NotFound(f"No session {session_id!r}.", details={"session_id": session_id}) from exc
            branch_operation("activate")
            return ActivePath(session_id=session_id, head_turn_id=head, path_turn_ids=path)

        if idempotency_key is None:
            return await create(""), False

        async def find(_: str) -> ActivePath | None:
            return None  # activating again is harmless: a retry after a crash just does it

        request = fingerprint(
            "POST", f"/v1/sessions/{session_id}/turns/{turn_id}/activate", body.model_dump()
        )
        return await self._idempotency.once(
            principal,
            idempotency_key,
            request,
            new_turn_id,
            find=find,
            create=create,
            load=ActivePath.model_validate,
            status_code=200,
        )

    # --- fork: a new session from the active path ----------------------------------------------------

    async def fork(
        self, principal: str, session_id: str, body: ForkRequest, *, idempotency_key: str | None = None
    ) -> tuple[SessionOut, bool]:
        """A new session of the caller's, with the session's settings and, as its history, a copy of the
        active path up to and including `body.turn_id` (new ids, the same timestamps)."""
        source = await self._sessions.owned(principal, session_id)
        turn_id = body.turn_id
        async with self._database.read() as db:
            found = await turn_tree.turn_start(db, session_id, turn_id)
        if found is None:
            raise _no_turn(session_id, turn_id)
        if not found[1]:
            raise TurnInProgress(
                f"Turn {turn_id} is still running; fork once it has ended.", details={"turn_id": turn_id}
            )

        async def create(new_id: str) -> SessionOut:
            fork_id = await self._copy(principal, source, turn_id, new_id)
            branch_operation("fork")
            return await self._sessions.get(principal, fork_id)

        if idempotency_key is None:
            return await create(new_session_id()), False

        async def find(new_id: str) -> SessionOut | None:
            try:
                return await self._sessions.get(principal, new_id)
            except NotFound:
                return None

        return await self._idempotency.once(
            principal,
            idempotency_key,
            fingerprint("POST", f"/v1/sessions/{session_id}/fork", body.model_dump()),
            new_session_id,
            find=find,
            create=create,
            load=SessionOut.model_validate,
            status_code=201,
        )

    async def _copy(self, principal: str, source: ChatSessionRow, turn_id: str, fork_id: str) -> str:
        at = now_iso()
        row = ChatSessionRow(
            id=fork_id,
            principal=principal,
            title=source.title,
            model=source.model,
            system_prompt=source.system_prompt,
            tools=list(source.tools),
            client_tools=list(source.client_tools),
            approval=list(source.approval),
            created_at=at,
            updated_at=at,
            context_window=source.context_window,
            context=source.context,
            session_metadata=dict(source.session_metadata or {}),
        )
        async with self._database.session() as db:
            rows = await repository.list_messages(db, source.id, through_turn=turn_id)
            await repository.insert_session(db, row, new_session_id)
            entries = [(key, metadata_text(value)) for key, value in row.session_metadata.items()]
            await repository.set_session_metadata(db, row.id, entries)
            copies = _copies(rows, row.id)
            head = next((c.turn_id for c in reversed(copies) if c.type == "turn_start"), None)
            await repository.insert_messages(db, copies, new_message_id)
            if head is not None:
                await turn_tree.set_head(db, row.id, head)
            await db.commit()
        return row.id

    # --- shared --------------------------------------------------------------------------------------

    async def _parent(self, session_id: str, turn_id: str) -> str | None:
        """The parent of the session's turn `turn_id`; 404 when the session has no such turn."""
        async with self._database.read() as db:
            found = await turn_tree.turn_start(db, session_id, turn_id)
        if found is None:
            raise _no_turn(session_id, turn_id)
        return found[0]

    async def _stop_first(self, session_id: str, delivery: BranchDelivery) -> None:
        if delivery == "interrupt":
            await self._turns.cancel(session_id)


def _no_turn(session_id: str, turn_id: str) -> NotFound:
    return NotFound(
        f"No turn {turn_id!r} in session {session_id!r}.",
        details={"session_id": session_id, "turn_id": turn_id},
    )


def _running(exc: TurnRunning) -> TurnInProgress:
    return TurnInProgress(
        f"A turn is running ({exc.turn_id or 'on another replica'}); nothing was changed. Stop it, or "
        "send delivery: interrupt.",
        details={"turn_id": exc.turn_id or None},
    )


def _again(row: ChatMessageRow) -> QueuedMessage:
    """A user message of the regenerated turn, asked again: its content, sender, time, client message id
    (a kit finds its message by it on every branch), client tools and files."""
    tools = [ClientTool.model_validate(t) for t in row.client_tools] if row.client_tools else None
    files = [Attachment.model_validate(a) for a in row.attachments] if row.attachments else None
    return QueuedMessage(
        id=new_message_id(),
        content=row.content or "",
        sender=row.sender or "User",
        client_message_id=row.client_message_id,
        timestamp=row.timestamp,
        delivery="steer",
        client_tools=tools,
        attachments=files,
    )


def _with_model(session: ChatSessionRow, model: str) -> ChatSessionRow:
    """The session as one turn sees it, answering with `model` (never stored)."""
    fields = {name: getattr(session, name) for name in ChatSessionRow.model_fields}
    return ChatSessionRow.model_validate({**fields, "model": model})


def _copies(rows: list[ChatMessageRow], session_id: str) -> list[ChatMessageRow]:
    """The rows again for the session `session_id`: new message and turn ids (ids are unique across
    sessions), parents mapped to the new turn ids, every other field (timestamps too) as it was."""
    turns: dict[str, str] = {}
    copies = []
    for row in rows:
        turn_id = turns.setdefault(row.turn_id, new_turn_id())
        fields = {name: getattr(row, name) for name in ChatMessageRow.model_fields if name != "position"}
        parent = row.parent_turn_id
        fields.update(
            id=new_message_id(),
            session_id=session_id,
            turn_id=turn_id,
            parent_turn_id=turns.get(parent) if parent is not None else None,
        )
        copies.append(new_message(**fields))
    return copies
