"""What the frontend kits' adapters (app.chat.adapters) share: a kit's chat id bound to a session per
principal, the new input a kit's request carries (a user message, or results of client tool calls) posted
through Parley's own use cases, and the session's event stream opened where a turn starts.

Nothing here writes history of its own: a turn started from a kit is an ordinary turn, on Parley's own
stream and page."""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal

from app.chat.branches import Branches
from app.chat.limits import StreamLimit, StreamSlot
from app.chat.messages import Messages
from app.chat.sessions import Sessions
from app.chat.tool_answers import ToolAnswers
from app.errors import Conflict, NotFound, PayloadTooLarge
from app.protocol.branches import EditRequest, RegenerateRequest
from app.protocol.clock import now_iso
from app.protocol.files import AttachmentRef
from app.protocol.ids import SESSION_ID_PATTERN
from app.protocol.schemas import ChatMessage, Delivery, MessageCreate, SessionCreate, SessionUpdate
from app.protocol.tool_requests import ApprovalsIn, ClientTool, DecisionItem, ToolResultItem, ToolResultsIn
from app.settings import Settings
from app.storage import chat_bindings
from app.storage.engine import Database
from app.streaming.broker import EventFanOut, Subscription
from app.streaming.frames import Frame

Kit = Literal["ai-sdk", "ag-ui"]
_SESSION_ID = re.compile(SESSION_ID_PATTERN)
HISTORY_PAGE = 1000


class NoNewInput(Conflict):
    """A kit's request whose last message is neither a user message nor an answer to a waiting call."""

    code = "no_new_input"


@dataclass(eq=False, slots=True)
class TurnFeed:
    """The session's committed frames from a position on, with the stream slot they hold; `close` once."""

    session_id: str
    subscription: Subscription
    slot: StreamSlot
    closed: bool = field(default=False)

    def batches(self) -> AsyncIterator[list[Frame]]:
        return self.subscription.batches()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.subscription.close()
            self.slot.release()


class KitChats:
    def __init__(
        self,
        settings: Settings,
        database: Database,
        sessions: Sessions,
        messages: Messages,
        answers: ToolAnswers,
        broker: EventFanOut,
        streams: StreamLimit,
        branches: Branches,
    ) -> None:
        self._settings = settings
        self._branches = branches
        self._database = database
        self._sessions = sessions
        self._messages = messages
        self._answers = answers
        self._broker = broker
        self._streams = streams

    def check_text(self, text: str) -> None:
        """The refusal `POST .../messages` would give a message too long, before a new chat is bound to a
        session: a refused request stores nothing."""
        limit = self._settings.max_message_chars
        if len(text) > limit:
            raise PayloadTooLarge(
                f"The message has {len(text)} characters; the limit is {limit}.",
                details={"field": "content", "limit": limit},
            )

    def check_note(self, note: str) -> None:
        """A note for the model (AG-UI's context) counts against the message limit: refused, the request
        stores nothing."""
        limit = self._settings.max_message_chars
        if len(note) > limit:
            raise PayloadTooLarge(
                f"The run's context has {len(note)} characters; the limit is {limit}.",
                details={"field": "context", "limit": limit},
            )

    async def session_for(
        self, principal: str, kit: Kit, chat_id: str, *, create: bool, model: str | None = None
    ) -> str | None:
        """The session a kit's chat id names: the caller's own session of that id, else the one bound to
        it for the caller (bound to a new session first when `create`, of `model` if given; an unknown
        model is refused before anything is stored); None when there is none."""
        if _SESSION_ID.fullmatch(chat_id):
            try:
                return (await self._sessions.owned(principal, chat_id)).id
            except NotFound:
                pass  # another principal's, or none: the id is a chat id like any other
        key = hashlib.sha256(chat_id.encode("utf-8", "surrogatepass")).hexdigest()
        async with self._database.read() as db:
            bound = await chat_bindings.bound_session(db, principal, kit, key)
        if bound is not None or not create:
            return bound
        created, _ = await self._sessions.create(principal, SessionCreate(model=model))
        async with self._database.session() as db:
            bound = await chat_bindings.bind_session(db, principal, kit, key, created.id, now_iso())
            await db.commit()
        if bound != created.id:  # a racing first request bound the chat first: use its session
            await self._sessions.delete(principal, created.id)
        return bound

    async def use_model(self, principal: str, session_id: str, model: str) -> None:
        """The session's model from now on, as `PATCH /v1/sessions/{id}` sets it (unknown: 422, unchanged)."""
        if (await self._sessions.owned(principal, session_id)).model != model:
            await self._sessions.update(principal, session_id, SessionUpdate(model=model))

    async def open_feed(self, principal: str, session_id: str, after: int | None) -> TurnFeed:
        """The session's frames after `after` (None: from now on), holding one of the caller's streams."""
        slot = await self._streams.acquire(principal)
        try:
            subscription = await self._broker.subscribe(session_id, after)
        except BaseException:
            slot.release()
            raise
        return TurnFeed(session_id, subscription, slot)

    async def running_turn(self, principal: str, session_id: str) -> tuple[str, int] | None:
        """The running turn and the position just before its `turn_start`, when a turn runs and the
        log still holds its start."""
        turn_id = (await self._sessions.get(principal, session_id)).running_turn_id
        if turn_id is None:
            return None
        async with self._database.read() as db:
            start = await chat_bindings.turn_start_seq(db, session_id, turn_id)
        return (turn_id, start - 1) if start is not None else None

    async def post_text(
        self,
        principal: str,
        session_id: str,
        text: str,
        *,
        client_message_id: str | None,
        client_tools: list[ClientTool] | None,
        attachments: list[AttachmentRef] | None = None,
        delivery: Delivery = "steer",
        note: str | None = None,
    ) -> str:
        """Posts the message (steered into a running turn unless `delivery` says otherwise, as Parley's
        default); its id. `note`: for the model, in the prompt of the turn that takes it (Messages.post)."""
        body = MessageCreate(
            content=text,
            client_message_id=client_message_id,
            client_tools=client_tools or None,
            attachments=attachments or None,
            delivery=delivery,
        )
        accepted, _ = await self._messages.post(principal, session_id, body, note=note)
        return accepted.id

    async def post_results(self, principal: str, session_id: str, results: list[ToolResultItem]) -> str:
        """Posts results of waiting client tool calls; the turn that waits for them."""
        pending = await self.waiting_calls(principal, session_id)
        answers = [r for r in results if r.tool_call_id in pending]
        if not answers:
            raise NoNewInput(
                "The last message is not a user message, and answers no tool call that waits.",
                details={"session_id": session_id},
            )
        resolved = await self._answers.tool_results(principal, session_id, ToolResultsIn(results=answers))
        return resolved.turn_id

    async def post_answers(
        self, principal: str, session_id: str, results: list[ToolResultItem], decisions: list[DecisionItem]
    ) -> str:
        """Posts what of a kit's answers is new: results of client tool calls and decisions on approvals
        that wait (a kit sends the calls it answered before again, with its whole message); the turn that
        waits for them."""
        waiting = {
            (p.kind, p.tool_call_id) for p in (await self._answers.pending(principal, session_id)).pending
        }
        answers = [r for r in results if ("client_tool", r.tool_call_id) in waiting]
        decided = [d for d in decisions if ("approval", d.tool_call_id) in waiting]
        if not answers and not decided:
            raise NoNewInput(
                "The last message is not a user message, and answers no tool call that waits.",
                details={"session_id": session_id},
            )
        turn_id = ""
        if decided:
            turn_id = await self.post_decisions(principal, session_id, decided)
        if answers:
            resolved = await self._answers.tool_results(principal, session_id, ToolResultsIn(results=answers))
            turn_id = resolved.turn_id
        return turn_id

    async def post_decisions(self, principal: str, session_id: str, decisions: list[DecisionItem]) -> str:
        """Posts a person's decisions on waiting approvals; the turn that waits for them."""
        resolved = await self._answers.approvals(principal, session_id, ApprovalsIn(decisions=decisions))
        return resolved.turn_id

    async def waiting_calls(self, principal: str, session_id: str) -> set[str]:
        """The client tool calls of the session that wait for a result."""
        waiting = (await self._answers.pending(principal, session_id)).pending
        return {p.tool_call_id for p in waiting if p.kind == "client_tool"}

    async def turn_of(self, principal: str, session_id: str, message_id: str | None) -> str:
        """find_turn's turn; unknown: 404."""
        found = await self.find_turn(principal, session_id, message_id)
        if found is None:
            raise NotFound(
                f"No message {message_id!r} on the chat's active path."
                if message_id is not None
                else "The chat has no turn to regenerate.",
                details={"session_id": session_id, "message_id": message_id},
            )
        return found

    async def find_turn(self, principal: str, session_id: str, message_id: str | None) -> str | None:
        """The turn a kit's message id names on the session's active path: an assistant message's id is its
        turn's (the adapters give the turn id), a user message's is its client_message_id or its id; None:
        the latest turn. None: not on the path."""
        turn: str | None = None
        found: str | None = None
        for message in await self.history(principal, session_id):
            if message.type == "turn_start":
                turn = message.turn_id
                if message_id is None or message_id == turn:
                    found = turn
            elif (
                message_id is not None
                and message.type == "text"
                and message.role == "user"
                and message_id in (message.id, message.client_message_id)
            ):
                found = turn
        return found

    async def regenerate(self, principal: str, session_id: str, turn_id: str) -> str:
        """Answers `turn_id`'s input again as its new sibling (chat.branches); the new turn's id."""
        turn, _ = await self._branches.regenerate(principal, session_id, turn_id, RegenerateRequest())
        return turn.turn_id

    async def edit(
        self,
        principal: str,
        session_id: str,
        turn_id: str,
        text: str,
        *,
        client_message_id: str | None,
        attachments: list[AttachmentRef] | None = None,
    ) -> str:
        """A sibling of `turn_id` whose user message is `text` with `attachments` (chat.branches); the new
        turn's id."""
        body = EditRequest(content=text, client_message_id=client_message_id, attachments=attachments or None)
        turn, _ = await self._branches.edit(principal, session_id, turn_id, body)
        return turn.turn_id

    async def history(self, principal: str, session_id: str) -> list[ChatMessage]:
        rows: list[ChatMessage] = []
        after: str | None = None
        while True:
            page = await self._messages.history(
                principal, session_id, limit=HISTORY_PAGE, after=after, before=None
            )
            rows.extend(page.chat_messages)
            if page.next_cursor is None:
                return rows
            after = page.next_cursor
