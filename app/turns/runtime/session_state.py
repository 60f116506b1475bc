"""A session's runtime state in this process and its waiting line: messages acknowledged while a turn runs,
stored durably and announced with their rows (the runner, turns/runtime/runner.py, decides when a turn
takes them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from app.protocol.events import UserMessage
from app.protocol.ids import new_message_id
from app.protocol.schemas import QueuedMessage
from app.protocol.tool_requests import ClientTool
from app.storage import repository
from app.storage.tables import ChatSessionRow, QueuedMessageRow
from app.streaming.log.write_behind import WriteBehind
from app.turns.control import NotWaiting, announce_queue
from app.turns.pending_calls import Inbox
from app.turns.recorder import TurnRecorder


@dataclass
class SessionState:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    task: asyncio.Task[None] | None = None
    recorder: TurnRecorder | None = None
    # Mirror of the session's waiting line (the queued_messages rows), in order.
    waiting: dict[str, QueuedMessage] = field(default_factory=dict)
    # Callers waiting for the turn that takes a waiting message: its turn id, or None if none ever will.
    takers: dict[str, asyncio.Future[str | None]] = field(default_factory=dict)
    closed: bool = False
    # Answers to the running turn's waiting calls (client results, approvals) on their way to its loop.
    inbox: Inbox | None = None
    # Callers holding or waiting for the lock (turns.runtime.state_cache: a state in use is never dropped).
    users: int = 0

    def resolve_takers(self, message_ids: Iterable[str], turn_id: str | None) -> None:
        for message_id in message_ids:
            future = self.takers.pop(message_id, None)
            if future is not None and not future.done():
                future.set_result(turn_id)

    def wants_breakpoint(self) -> bool:
        return any(m.delivery in ("steer", "interrupt") for m in self.waiting.values())


async def enqueue(
    writer: WriteBehind,
    session: ChatSessionRow,
    state: SessionState,
    message: QueuedMessage,
    client_tools: Sequence[ClientTool] | None,
) -> None:
    """Stores the message in the waiting line; the row and its announcement commit together, so a client
    never misses a waiting message. Called under the session's lock."""
    tools = [t.model_dump(mode="json") for t in client_tools] if client_tools else None
    attachments = message.attachments or []
    row = QueuedMessageRow(
        session_id=session.id,
        **message.model_dump(),
        client_tools=tools,
        attachments=[a.model_dump() for a in attachments] or None,
        note=message.note,
    )
    events = writer.publisher(session.id)
    async with writer.transaction(session.id) as db:
        await repository.enqueue(db, row, new_message_id)
        message.id = row.id  # a fresh one if another message held it
        events.emit(
            UserMessage,
            id=message.id,
            text=message.content,
            timestamp=message.timestamp,
            turn_id=None,
            model=session.model,
            sender=message.sender,
            queued=True,
            client_message_id=message.client_message_id,
            attachments=attachments,
        )
        announce_queue([*state.waiting.values(), message], events)
    state.waiting[message.id] = message


async def withdraw(
    writer: WriteBehind,
    state: SessionState,
    session_id: str,
    current: list[QueuedMessage],
    message_ids: list[str] | None,
) -> list[QueuedMessage]:
    """Takes messages out of the waiting line `current` (all of them when `message_ids` is None). Called
    under the session's lock."""
    chosen = [m for m in current if message_ids is None or m.id in message_ids]
    if message_ids is not None and len(chosen) != len(message_ids):
        raise NotWaiting(message_ids)
    if not chosen:
        return []
    gone = [m.id for m in chosen]
    async with writer.transaction(session_id) as db:
        await repository.dequeue(db, gone)
        left = [m for m in state.waiting.values() if m.id not in gone]
        announce_queue(left, writer.publisher(session_id))
    for m in chosen:
        state.waiting.pop(m.id, None)
    state.resolve_takers(gone, None)
    return chosen
