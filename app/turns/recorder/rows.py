"""The turn every part of the recorder writes: who it is (session, turn, model), where its writes go (a
transaction of the write-behind, whose events commit with it) and its events (the session's publisher),
and the agent status it announced last. It builds the turn's chat_messages rows (docs/protocol.md) and
writes the first of them: the turn's opening.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from sqlmodel.ext.asyncio.session import AsyncSession

from app.protocol.clock import now_iso
from app.protocol.events import (
    AgentState,
    AgentStatus,
    BranchChanged,
    QueuedItem,
    QueueUpdated,
    TurnStart,
    UserMessage,
)
from app.protocol.ids import new_message_id
from app.protocol.schemas import QueuedMessage
from app.storage import repository, turn_tree
from app.storage.tables import ChatMessageRow, new_message
from app.streaming.frames import Publisher
from app.streaming.log.write_behind import WriteBehind
from app.turns.agent import CallRequest
from app.turns.live import LiveStatus, LiveStatusBoard

# Claims the turn's lease, first thing in the transaction that opens it (multi-replica mode).
Claim = Callable[[AsyncSession], Awaitable[None]]


@dataclass(frozen=True)
class BranchFrom:
    """A turn opened beside the others of `parent_turn_id` (a regenerate or an edit: docs/protocol.md,
    Branches), where a posted message's turn continues the active path from its head."""

    parent_turn_id: str | None


@dataclass
class TurnRows:
    writer: WriteBehind
    events: Publisher
    live: LiveStatusBoard
    session_id: str
    turn_id: str
    model: str
    # The last agent_status this turn announced (ToolRequests.settle_status announces only a change).
    status: tuple[AgentState, str | None] | None = None
    # The session's whole history once the opening committed, when the session held no message before it:
    # the rows the opening wrote. The turn builds its prompt from them instead of reading them back
    # (TurnAgent.prepare); taken once (take_history).
    history: list[ChatMessageRow] | None = None

    def row(self, type_: str, timestamp: str, **fields: Any) -> ChatMessageRow:
        return new_message(
            id=fields.pop("id", None) or new_message_id(),
            session_id=self.session_id,
            turn_id=self.turn_id,
            type=type_,
            timestamp=timestamp,
            **fields,
        )

    def tool_row(
        self, call: CallRequest, response_id: str | None, timestamp: str, **fields: Any
    ) -> ChatMessageRow:
        return self.row(
            "tool_group",
            timestamp,
            role="assistant",
            model=self.model,
            response_id=response_id,
            tool_call_id=call.id,
            tool_name=call.name,
            arguments=call.arguments,
            **fields,
        )

    def transaction(self, *, final: bool = False) -> AbstractAsyncContextManager[AsyncSession]:
        """A write of the turn; events emitted inside it commit with it and are delivered right after. In
        multi-replica mode it goes through only under the turn's lease; `final` (turn_done) releases it."""
        return self.writer.transaction(self.session_id, turn_id=self.turn_id, final=final)

    def emit(self, cls: Any, **fields: Any) -> None:
        self.events.emit(cls, **fields)

    def set_status(self, status: AgentState, tool_name: str | None = None) -> None:
        self.status = (status, tool_name)
        self.live.set(self.session_id, LiveStatus(status, None if status == "idle" else self.turn_id))
        self.emit(AgentStatus, status=status, tool_name=tool_name, turn_id=self.turn_id)

    async def open(
        self,
        messages: Sequence[QueuedMessage],
        *,
        waiting: list[QueuedItem] | None = None,
        claim: Claim | None = None,
        branch: BranchFrom | None = None,
    ) -> None:
        """Starts the turn: its turn_start and the user messages it takes, with their events, in one
        transaction (after `claim`, when given). `waiting` is the waiting line once the messages left it,
        when they come from it. The turn follows the session's head, or the parent `branch` names; either
        way it becomes the head, and a branch announces the new active path."""
        at = now_iso()
        users = [
            self.row(
                "text",
                m.timestamp,
                id=m.id,
                role="user",
                content=m.content,
                sender=m.sender,
                client_message_id=m.client_message_id,
                client_tools=[t.model_dump(mode="json") for t in m.client_tools] if m.client_tools else None,
                attachments=[a.model_dump() for a in m.attachments] if m.attachments else None,
                note=m.note,
            )
            for m in messages
        ]
        async with self.transaction() as db:
            if claim is not None:
                await claim(db)
            if waiting is not None:
                await repository.dequeue(db, [m.id for m in messages])
            # Under the opening's lease and the session's write lane: no other write of the session runs.
            parent = (
                branch.parent_turn_id if branch is not None else await turn_tree.head(db, self.session_id)
            )
            start = self.row("turn_start", at, parent_turn_id=parent)
            # Every message belongs to a turn: a session without one holds none.
            fresh = parent is None and branch is None
            renamed = await repository.insert_messages(db, [start, *users], new_message_id)
            for m in messages:  # a message whose id another row held: the row's fresh id is its id now
                m.id = renamed.get(m.id, m.id)
            if waiting is not None:
                self.events.emit(QueueUpdated, queue=waiting)
            self.events.emit(TurnStart, id=start.id, turn_id=self.turn_id, timestamp=at)
            for m in messages:
                self.events.emit(
                    UserMessage,
                    id=m.id,
                    text=m.content,
                    timestamp=m.timestamp,
                    turn_id=self.turn_id,
                    model=self.model,
                    sender=m.sender,
                    client_message_id=m.client_message_id,
                    attachments=m.attachments or [],
                )
            await turn_tree.set_head(db, self.session_id, self.turn_id)
            if branch is not None:
                path = await turn_tree.path(db, self.session_id, self.turn_id)
                self.events.emit(BranchChanged, head_turn_id=self.turn_id, path_turn_ids=path)
            self.set_status("thinking")
        self.history = [start, *users] if fresh else None

    def take_history(self) -> list[ChatMessageRow] | None:
        """The history the opening wrote, when it is the session's whole history (`history`), once."""
        history, self.history = self.history, None
        return history
