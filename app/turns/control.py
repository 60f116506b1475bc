"""Turn ownership and control: who runs a session's turn, and how requests act on it (post, cancel, steer
by delivery, the waiting line, waits for a turn's end). The use-case layer reaches turns only here.

The runner (turns.runtime.runner) is today's in-process implementation: one process owns every turn.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from app.errors import StorageUnavailable
from app.protocol.events import QueuedItem, QueueUpdated
from app.protocol.files import Attachment
from app.protocol.schemas import CancelResult, Delivery, MessageAccepted, QueuedMessage
from app.protocol.tool_requests import ClientTool, Resolution
from app.storage.tables import ChatSessionRow, QueuedMessageRow
from app.streaming.frames import Publisher
from app.turns.live import LiveStatus
from app.turns.pending_calls import Kind


class SessionClosed(LookupError):
    """The session is being deleted."""


class ShuttingDown(RuntimeError):
    """The server is stopping and takes no new messages."""


class TurnRunning(RuntimeError):
    def __init__(self, turn_id: str) -> None:
        super().__init__(turn_id)
        self.turn_id = turn_id


class TurnBusy(RuntimeError):
    """Multi-replica mode: another turn of the session runs (on some replica); a message waits instead."""


class NotWaiting(LookupError):
    """The message is not (or no longer) in the waiting line."""


class TurnControl(Protocol):
    """Runs at most one turn per session and lets any request act on it.

    A multi-process implementation must guarantee, across processes, what the runner guarantees in one:
    - ownership: at most one running turn per session, enforced by the database (a lease row with a
      fencing token that every write of the turn checks), not by a process's memory; a turn whose owner
      died is closed (as recovery closes it) and the session's waiting messages then start elsewhere;
    - posting: a message is stored before it is acknowledged, and is taken by exactly one turn, in order;
    - cancel and delivery modes (steer, interrupt) reach the owner wherever the request lands: durably
      (a flag the owner reads at its next heartbeat) and fast (a broadcast it hears);
    - waits (`turn_end`, `taker`) return once the turn's end or the taking has committed, wherever it
      ran; cancelling a wait never stops a turn;
    - `statuses` reads the status the owner last announced, and names the running turn until its
      `turn_done` has committed; `is_closed` and `closing` hold for every process.
    """

    @property
    def closing(self) -> bool: ...

    async def statuses(self, session_ids: Sequence[str]) -> dict[str, LiveStatus]:
        """Each session's live status (one read for a page of sessions)."""
        ...

    def is_closed(self, session_id: str) -> bool: ...

    async def post(
        self,
        session: ChatSessionRow,
        content: str,
        sender: str,
        delivery: Delivery,
        *,
        message_id: str | None = None,
        client_message_id: str | None = None,
        client_tools: list[ClientTool] | None = None,
        attachments: list[Attachment] | None = None,
        note: str | None = None,
    ) -> MessageAccepted: ...

    async def cancel(self, session_id: str, *, clear_queue: bool = False) -> CancelResult: ...

    async def branch(
        self,
        session: ChatSessionRow,
        messages: list[QueuedMessage],
        parent_turn_id: str | None,
        *,
        turn_id: str,
    ) -> str:
        """Opens the turn `turn_id` taking `messages` as a child of `parent_turn_id` (a regenerate or an
        edit: docs/protocol.md, Branches); it heads the active path. TurnRunning while a turn of the
        session runs (anywhere); nothing is stored then."""
        ...

    async def activate(self, session_id: str, turn_id: str) -> tuple[str, list[str]]:
        """Makes the active path the one through `turn_id`, down to the latest turn under it: (head, path).
        TurnRunning while a turn of the session runs."""
        ...

    async def queue(self, session_id: str) -> list[QueuedMessage]: ...

    async def withdraw(
        self, session_id: str, message_ids: list[str] | None = None
    ) -> list[QueuedMessage]: ...

    async def turn_end(self, turn_id: str) -> None: ...

    async def answer(self, session_id: str, kind: Kind, items: list[dict[str, Any]]) -> list[Resolution]:
        """Hands answers (client tool results, decisions) to the session's turn that waits for them; returns
        once they are committed. A multi-process implementation routes them to the turn's owner, or has
        the owner read them from the pending rows."""
        ...

    async def taker(self, session_id: str, message_id: str) -> str | None: ...

    async def delete_session(self, session_id: str) -> None:
        """Stops the session's turn, starts nothing after it, and deletes the session with its history,
        its log and its streams."""
        ...


def queued_message(row: QueuedMessageRow) -> QueuedMessage:
    return QueuedMessage.model_validate(row, from_attributes=True)


def accepted(session_id: str, message: QueuedMessage, turn_id: str | None) -> MessageAccepted:
    return MessageAccepted(
        id=message.id,
        session_id=session_id,
        content=message.content,
        sender=message.sender,
        client_message_id=message.client_message_id,
        timestamp=message.timestamp,
        turn_id=turn_id,
        queued=turn_id is None,
        delivery=message.delivery,
        attachments=message.attachments or [],
    )


def end_not_stored(refusal: StorageUnavailable, *, stopping: bool) -> StorageUnavailable:
    """The refusal of a cancel whose turn cannot write its end: storage refuses it (full, busy, failing),
    with the same code and wait."""
    what = "The turn is stopped" if stopping else "The turn has already ended"
    return refusal.again(
        f"{what}, but its end cannot be stored yet: {refusal.message} It is written, in order, once "
        "storage works again."
    )


def announce_queue(waiting: Iterable[QueuedMessage], events: Publisher) -> None:
    events.emit(QueueUpdated, queue=[QueuedItem(**m.model_dump()) for m in waiting])
