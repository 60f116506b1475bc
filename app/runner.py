"""Runs turns: one task per running turn, a waiting line per session, stop, and shutdown.

A session is idle or runs exactly one turn. A message posted to an idle session starts a turn at once;
one posted to a busy session is stored durably in the waiting line and taken, together with everything
else waiting, when the turn reaches its next breakpoint or ends.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from app import repository
from app.agent import AgentRun
from app.broker import Broker
from app.clock import new_message_id, new_turn_id, now_iso
from app.db import Database
from app.events import AgentStatus, TurnStart, UserMessage
from app.history import rebuild
from app.llm.layer import ModelLayer
from app.models import ChatMessageRow, ChatSessionRow, QueuedMessageRow
from app.recorder import LiveStatus, TurnRecorder
from app.schemas import CancelResult, MessageAccepted
from app.settings import Settings
from app.tools.registry import ToolRegistry
from app.writer import WriteBehind

log = logging.getLogger(__name__)


class SessionClosed(LookupError):
    """The session is being deleted."""


@dataclass
class _Pending:
    id: str
    content: str
    sender: str
    timestamp: str


@dataclass
class SessionState:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    live: LiveStatus = field(default_factory=LiveStatus)
    task: asyncio.Task[None] | None = None
    recorder: TurnRecorder | None = None
    waiting: int = 0
    cancelling: bool = False
    # Set when the session is being deleted: nothing more may start.
    closed: bool = False
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()


class Runner:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        broker: Broker,
        writer: WriteBehind,
        models: ModelLayer,
        tools: ToolRegistry,
    ) -> None:
        self._settings = settings
        self._db = db
        self._broker = broker
        self._writer = writer
        self._models = models
        self._tools = tools
        self._states: dict[str, SessionState] = {}
        self._closing = False

    def state(self, session_id: str) -> SessionState:
        state = self._states.get(session_id)
        if state is None:
            state = self._states[session_id] = SessionState()
        return state

    def live(self, session_id: str) -> LiveStatus:
        state = self._states.get(session_id)
        return state.live if state is not None else LiveStatus()

    # --- posting -------------------------------------------------------------------------------------

    async def post(self, session: ChatSessionRow, content: str, sender: str) -> MessageAccepted:
        if self._closing:
            raise RuntimeError("shutting down")
        state = self.state(session.id)
        if state.closed:
            raise SessionClosed(session.id)
        pending = _Pending(new_message_id(), content, sender, now_iso())
        async with state.lock:
            if state.task is None:
                turn_id = await self._begin(session, state, [pending], queued_ids=[])
                return MessageAccepted(
                    id=pending.id,
                    session_id=session.id,
                    content=content,
                    sender=sender,
                    timestamp=pending.timestamp,
                    turn_id=turn_id,
                    queued=False,
                )
            row = QueuedMessageRow(
                id=pending.id,
                session_id=session.id,
                content=content,
                sender=sender,
                timestamp=pending.timestamp,
            )
            async with self._db.session() as db:
                await repository.enqueue(db, row)
                await db.commit()
            state.waiting += 1
            channel = await self._broker.channel(session.id)
            channel.publish(
                UserMessage,
                id=pending.id,
                text=content,
                timestamp=pending.timestamp,
                turn_id=None,
                model=session.model,
                sender=sender,
                queued=True,
            )
        return MessageAccepted(
            id=pending.id,
            session_id=session.id,
            content=content,
            sender=sender,
            timestamp=pending.timestamp,
            turn_id=None,
            queued=True,
        )

    async def _begin(
        self, session: ChatSessionRow, state: SessionState, messages: list[_Pending], queued_ids: list[str]
    ) -> str:
        """Writes turn_start and the user messages in one transaction, announces them, starts the task."""
        turn_id = new_turn_id()
        start_id = new_message_id()
        started_at = now_iso()
        rows = [
            ChatMessageRow(
                id=start_id, session_id=session.id, turn_id=turn_id, type="turn_start", timestamp=started_at
            )
        ]
        rows += [
            ChatMessageRow(
                id=m.id,
                session_id=session.id,
                turn_id=turn_id,
                type="text",
                role="user",
                content=m.content,
                sender=m.sender,
                timestamp=m.timestamp,
            )
            for m in messages
        ]
        async with self._db.session() as db:
            if queued_ids:
                await repository.dequeue(db, queued_ids)
            await repository.insert_messages(db, rows)
            await db.commit()
        channel = await self._broker.channel(session.id)
        channel.publish(TurnStart, id=start_id, turn_id=turn_id, timestamp=started_at)
        for m in messages:
            channel.publish(
                UserMessage,
                id=m.id,
                text=m.content,
                timestamp=m.timestamp,
                turn_id=turn_id,
                model=session.model,
                sender=m.sender,
            )
        state.live.agent_status = "thinking"
        state.live.turn_id = turn_id
        channel.publish(AgentStatus, status="thinking", turn_id=turn_id)
        recorder = TurnRecorder(
            db=self._db,
            writer=self._writer,
            channel=channel,
            live=state.live,
            session_id=session.id,
            turn_id=turn_id,
            model=session.model,
            context_window=None,
        )
        state.recorder = recorder
        state.cancelling = False
        state.idle.clear()
        state.task = asyncio.create_task(self._run(session.id, state, recorder), name=f"turn:{turn_id}")
        return turn_id

    async def _run(self, session_id: str, state: SessionState, recorder: TurnRecorder) -> None:
        try:
            await self._execute(session_id, state, recorder)
        except asyncio.CancelledError:
            # Cancelled before the recorder took charge (the turn had not reached the model yet).
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            await recorder.commit_interrupted("[Tool execution interrupted by user]")
            await recorder.close("cancelled")
        except Exception:
            log.exception("turn %s could not run", recorder.turn_id)
            await recorder.fail("internal_error", "The turn failed because of an internal error.")
            await recorder.close("failed")
        finally:
            await self._after(session_id, state)

    async def _execute(self, session_id: str, state: SessionState, recorder: TurnRecorder) -> None:
        async with self._db.session() as db:
            session = await repository.get_session(db, session_id)
            rows = await repository.list_messages(db, session_id)
        if session is None:
            raise RuntimeError(f"session {session_id} vanished")
        model = await self._models.resolve(session.model)
        recorder.context_window = model.context_window
        adapter = await self._models.adapter(model)
        settings = self._settings
        agent = AgentRun(
            adapter=adapter,
            model=model,
            tools=self._tools,
            tool_names=list(session.tools),
            messages=rebuild(rows, session.system_prompt),
            session_id=session_id,
            turn_id=recorder.turn_id,
            max_rounds=settings.max_tool_rounds,
            tool_timeout=settings.tool_timeout,
            provider_timeout=settings.provider_timeout,
            retries=settings.provider_retries,
            retry_backoff=settings.provider_retry_backoff,
            should_pause=lambda: state.waiting > 0,
        )
        await recorder.record(agent)

    async def _after(self, session_id: str, state: SessionState) -> None:
        """The turn is closed: take what waits as the next turn, or go idle."""
        async with state.lock:
            state.task = None
            state.recorder = None
            if not self._closing and not state.closed:
                async with self._db.session() as db:
                    session = await repository.get_session(db, session_id)
                    waiting = await repository.queued(db, session_id) if session is not None else []
                if session is not None and waiting:
                    state.waiting = 0
                    pending = [_Pending(w.id, w.content, w.sender, w.timestamp) for w in waiting]
                    await self._begin(session, state, pending, queued_ids=[w.id for w in waiting])
                    return
            state.waiting = 0
            state.idle.set()

    # --- stopping ------------------------------------------------------------------------------------

    async def cancel(self, session_id: str) -> CancelResult:
        state = self._states.get(session_id)
        if state is None or state.task is None or state.recorder is None:
            return CancelResult(cancelled=False)
        task, turn_id = state.task, state.recorder.turn_id
        if not state.cancelling:
            state.cancelling = True
            task.cancel()
        await asyncio.wait({task})
        return CancelResult(cancelled=True, turn_id=turn_id)

    async def resume_waiting(self) -> None:
        """At startup: messages acknowledged before a restart but never taken start their turns now."""
        async with self._db.session() as db:
            session_ids = await repository.sessions_with_queue(db)
        for session_id in session_ids:
            state = self.state(session_id)
            async with state.lock:
                if state.task is None:
                    await self._after_locked_start(session_id, state)

    async def _after_locked_start(self, session_id: str, state: SessionState) -> None:
        async with self._db.session() as db:
            session = await repository.get_session(db, session_id)
            waiting = await repository.queued(db, session_id)
        if session is not None and waiting:
            pending = [_Pending(w.id, w.content, w.sender, w.timestamp) for w in waiting]
            await self._begin(session, state, pending, queued_ids=[w.id for w in waiting])

    async def close_session(self, session_id: str) -> None:
        """Before a delete: stop the turn and start nothing after it."""
        self.state(session_id).closed = True
        await self.cancel(session_id)

    def forget(self, session_id: str) -> None:
        self._states.pop(session_id, None)

    async def shutdown(self) -> None:
        self._closing = True
        running = [(sid, s) for sid, s in self._states.items() if s.task is not None]
        await asyncio.gather(*(self.cancel(sid) for sid, _ in running), return_exceptions=True)
