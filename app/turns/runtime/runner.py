"""Runs turns: one task per running turn, a waiting line per session, stop, and shutdown.

A session is idle or runs exactly one turn. A message posted to an idle session starts a turn at once.
One posted to a busy session is stored durably in the waiting line and announced; what happens next
depends on its delivery (docs/api.md, Messages while a turn runs): `steer` ends the running turn at its
next breakpoint (after a
tool round's results, before the next model call), `queue` waits for the turn to end by itself,
`interrupt` stops the turn as Stop does, `reject` refuses with 409. When a turn ends, everything waiting
is taken together, in order, as the next turn.

A caller may wait for a turn's end (`turn_end`) and for the turn that takes a waiting message (`taker`):
what `?wait=true` needs. Neither wait holds anything a turn needs, and cancelling one never stops a turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Sequence
from contextlib import suppress
from typing import Any

from app.errors.storage import storage_refusal
from app.llm.gateway import ModelGateway
from app.observability.hooks import message_queued, observe_turn, turn_cancelled
from app.protocol.clock import now_iso
from app.protocol.events import BranchChanged, QueuedItem
from app.protocol.files import Attachment
from app.protocol.ids import new_message_id, new_turn_id
from app.protocol.schemas import CancelResult, Delivery, MessageAccepted, QueuedMessage
from app.protocol.tool_requests import ClientTool, Resolution
from app.settings import Settings
from app.storage import files, repository, turn_queries, turn_tree
from app.storage.blobs import Blobs
from app.storage.engine import Database
from app.storage.tables import ChatMessageRow, ChatSessionRow
from app.streaming.broker import EventFanOut
from app.streaming.log.write_behind import WriteBehind
from app.tools.registry import ToolRegistry
from app.turns.control import (
    SessionClosed,
    ShuttingDown,
    TurnBusy,
    TurnRunning,
    accepted,
    end_not_stored,
    queued_message,
)
from app.turns.execution import AgentFactory, run_turn
from app.turns.live import IDLE, LiveStatus, LiveStatusBoard
from app.turns.pending_calls import Inbox, Kind, NoPendingCall
from app.turns.recorder import TurnRecorder
from app.turns.recorder.rows import BranchFrom
from app.turns.runtime.notifier import LocalNotifier, Notifier
from app.turns.runtime.ownership import LocalOwnership, MakeOwnership
from app.turns.runtime.session_state import SessionState, enqueue, withdraw
from app.turns.runtime.state_cache import SessionStates

log = logging.getLogger(__name__)

# Seconds before waiting messages that storage refused to take are tried again.
TAKE_RETRY_SECONDS = 1.0


class Runner:
    def __init__(
        self,
        settings: Settings,
        database: Database,
        writer: WriteBehind,
        models: ModelGateway,
        tools: ToolRegistry,
        live: LiveStatusBoard,
        fanout: EventFanOut,
        *,
        ownership: MakeOwnership = LocalOwnership,
        notifier: Notifier | None = None,
        blobs: Blobs,
    ) -> None:
        """`ownership` makes who owns this process's turns (turns.runtime.ownership), handed this runner
        for what it asks back; `notifier` hears where turns run (turns.runtime.notifier)."""
        self._settings = settings
        self._database = database
        self._writer = writer
        self._live = live
        self._fanout = fanout
        self._notifier = notifier or LocalNotifier()
        self._blobs = blobs
        self._agent = AgentFactory(settings, database, models, tools, blobs)
        self.ownership = ownership(self)
        self._states: dict[str, SessionState] = {}
        # With leases the line is the table (other replicas add to it): a stale mirror keeps nothing alive.
        self.sessions = SessionStates(
            self._states,
            writer.let_go,
            line_here=self.ownership.line_here,
            keep_seconds=settings.idle_session_seconds,
        )
        self._closing = False
        # While the startup repair waits for storage (turns.recovery.StartupRepair), a post only queues
        # its message: no turn may start before the turns a crash left open are closed.
        self._held = False
        # Every turn of this process from before its first row is written until its task is done.
        self._turn_ends: dict[str, asyncio.Future[None]] = {}
        self._retries: set[asyncio.Task[None]] = set()
        # Requests from other replicas (a cancel, a re-read of the line), each in a task of its own.
        self._background: set[asyncio.Task[Any]] = set()
        # Turns of this process a stop was asked for (a cancel, an interrupt): each is stopped once, whether
        # the request came by broadcast, by the flag on its lease, or from a waiting interrupt message.
        self._stopping: set[str] = set()

    @property
    def closing(self) -> bool:
        return self._closing

    def hold_turns(self) -> None:
        """Posts queue their messages and start no turn, until `release_turns` (the startup repair)."""
        self._held = True

    def release_turns(self) -> None:
        self._held = False

    def runs(self, session_id: str) -> bool:
        """A turn of the session runs in this process."""
        return (state := self._states.get(session_id)) is not None and state.task is not None

    def holds_waiting(self, session_id: str, message_id: str) -> bool:
        """The message waits in this process's mirror of the session's waiting line."""
        state = self._states.get(session_id)
        return state is not None and message_id in state.waiting

    def owns_turn(self, turn_id: str) -> bool:
        """The turn runs in this process (from before its first row is written until its task is done)."""
        return turn_id in self._turn_ends

    def state(self, session_id: str) -> SessionState:
        return self.sessions.state(session_id)

    async def statuses(self, session_ids: Sequence[str]) -> dict[str, LiveStatus]:
        return {session_id: self._live.get(session_id) for session_id in session_ids}

    def is_closed(self, session_id: str) -> bool:
        """The session is being deleted (its turn was stopped for that, and nothing starts after it)."""
        return (state := self._states.get(session_id)) is not None and state.closed

    # --- posting -------------------------------------------------------------------------------------

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
    ) -> MessageAccepted:
        if self._closing:
            raise ShuttingDown
        message = QueuedMessage(
            id=message_id or new_message_id(),
            content=content,
            sender=sender,
            client_message_id=client_message_id,
            timestamp=now_iso(),
            delivery=delivery,
            client_tools=client_tools,
            attachments=attachments or None,
            note=note,
        )
        async with self.sessions.held(session.id) as state:
            if state.closed:
                raise SessionClosed(session.id)
            if state.task is None and not self._held and await self._may_open(session.id, state):
                try:
                    turn_id = await self._start_turn(session, state, [message], from_queue=False)
                except TurnBusy:  # a turn of the session runs on another replica, or messages wait:
                    await self._line_empty(session.id, state)  # it waits too (the mirror read for its event)
                else:
                    return accepted(session.id, message, turn_id)
            if delivery == "reject" and state.recorder is not None and state.task is not None:
                raise TurnRunning(state.recorder.turn_id)
            await enqueue(self._writer, session, state, message, client_tools)
            message_queued(len(state.waiting))
            if state.task is None and not self._held:
                # Messages are waiting with no turn to take them (taking them failed): they go first.
                await self._take_waiting(session.id, state)
                taker = state.recorder
                if taker is not None and message.id in taker.taken_ids:
                    return accepted(session.id, message, taker.turn_id)
        if delivery == "interrupt":
            await self._interrupt(session.id)
            taker = state.recorder
            if taker is not None and message.id in taker.taken_ids:
                return accepted(session.id, message, taker.turn_id)
        return accepted(session.id, message, None)

    async def _interrupt(self, session_id: str) -> None:
        """An interrupt stops the running turn as Stop does; its end takes the waiting messages. A turn of
        another replica: its owner stops it once it reads the waiting interrupt (notified by
        turns.replicas.turns, or at its next heartbeat); if the owner is gone, the sweeper closes the turn."""
        if self.runs(session_id):
            await self.cancel(session_id)

    # --- branches (docs/protocol.md, Branches) ---------------------------------------------------------

    async def branch(
        self,
        session: ChatSessionRow,
        messages: list[QueuedMessage],
        parent_turn_id: str | None,
        *,
        turn_id: str,
    ) -> str:
        """A turn beside the others of `parent_turn_id`, taking `messages`; refused while a turn runs."""
        if self._closing or self._held:
            raise ShuttingDown
        async with self.sessions.held(session.id) as state:
            if state.closed:
                raise SessionClosed(session.id)
            if state.task is not None and state.recorder is not None:
                raise TurnRunning(state.recorder.turn_id)
            try:
                return await self._start_turn(
                    session,
                    state,
                    messages,
                    from_queue=False,
                    branch=BranchFrom(parent_turn_id),
                    turn_id=turn_id,
                )
            except TurnBusy as exc:  # leased: a turn of the session runs on another replica
                async with self._database.read() as db:
                    running = await turn_queries.open_turn_id(db, session.id)
                raise TurnRunning(running or "") from exc

    async def activate(self, session_id: str, turn_id: str) -> tuple[str, list[str]]:
        """The active path through `turn_id`, down to the latest turn under it; announced if it changed."""
        async with self.sessions.held(session_id) as state:
            if state.closed:
                raise SessionClosed(session_id)
            if state.task is not None and state.recorder is not None:
                raise TurnRunning(state.recorder.turn_id)
            events = self._writer.publisher(session_id)
            async with self._writer.transaction(session_id) as db:
                running = await turn_queries.open_turn_id(db, session_id)
                if running is not None:  # on another replica
                    raise TurnRunning(running)
                head = await turn_tree.latest_in_subtree(db, session_id, turn_id)
                path = await turn_tree.path(db, session_id, head)
                if head != await turn_tree.head(db, session_id):
                    await turn_tree.set_head(db, session_id, head)
                    # The context the session shows is the new path's: its head's last response's.
                    used = await turn_tree.context_used_at(db, session_id, head)
                    if used is not None:
                        await turn_tree.set_context_used(db, session_id, used)
                    events.emit(BranchChanged, head_turn_id=head, path_turn_ids=path)
            return head, path

    async def _start_turn(
        self,
        session: ChatSessionRow,
        state: SessionState,
        messages: list[QueuedMessage],
        *,
        from_queue: bool,
        branch: BranchFrom | None = None,
        turn_id: str | None = None,
    ) -> str:
        """Writes turn_start and the user messages in one transaction, announces them, starts the task."""
        turn_id = turn_id or new_turn_id()
        # Registered before its rows commit: whoever can read the turn can also wait for its end.
        self._turn_ends[turn_id] = asyncio.get_running_loop().create_future()
        try:
            return await self._open_turn(
                session, state, messages, turn_id, from_queue=from_queue, branch=branch
            )
        except BaseException:
            self._turn_ended(turn_id)
            raise

    async def _open_turn(
        self,
        session: ChatSessionRow,
        state: SessionState,
        messages: list[QueuedMessage],
        turn_id: str,
        *,
        from_queue: bool,
        branch: BranchFrom | None = None,
    ) -> str:
        claim = self.ownership.claim(session.id, turn_id, posted=not from_queue)
        recorder = self._recorder(session, turn_id, claim=claim, taken_ids=frozenset(m.id for m in messages))
        taken = {m.id for m in messages}
        waiting = [QueuedItem(**m.model_dump()) for m in state.waiting.values() if m.id not in taken]
        try:
            await recorder.open(messages, waiting=waiting if from_queue else None, branch=branch)
        except BaseException:
            self.ownership.not_opened(turn_id)
            self._live.set(session.id, IDLE)
            raise
        for message_id in taken:
            state.waiting.pop(message_id, None)
        self._run(session, state, recorder)
        state.resolve_takers(taken, turn_id)
        if not from_queue and not self.ownership.line_here:
            state.waiting.clear()  # the claim found the line empty; a stale mirror would pause the turn
        # Owned from its commit on, before the turn's task takes its first step.
        self.ownership.opened(session.id, turn_id, self._stopper(state, recorder))
        return turn_id

    def _stopper(self, state: SessionState, recorder: TurnRecorder) -> Any:
        """What stops the turn here when its ownership is lost (a lease found expired or taken over)."""

        def stop() -> None:
            if state.recorder is recorder:
                recorder.request_stop(by_server=True)

        return stop

    def _recorder(self, session: ChatSessionRow, turn_id: str, **fields: Any) -> TurnRecorder:
        events = self._writer.publisher(session.id)
        return TurnRecorder(self._writer, events, self._live, session.id, turn_id, session.model, **fields)

    def _run(
        self,
        session: ChatSessionRow,
        state: SessionState,
        recorder: TurnRecorder,
        *,
        resuming: bool = False,
    ) -> None:
        state.recorder, state.inbox = recorder, Inbox()
        state.task = recorder.task = asyncio.create_task(
            self._turn_task(session, state, recorder, resuming), name=f"turn:{recorder.turn_id}"
        )
        self._notifier.running(session.id, True)
        # A task's callbacks run even when it is cancelled before it ever starts.
        state.task.add_done_callback(lambda _: self._turn_ended(recorder.turn_id))

    def resume_turn(
        self, session: ChatSessionRow, turn_id: str, started: float, round_rows: list[ChatMessageRow]
    ) -> None:
        """At startup: a turn that waited for answers when the server stopped goes on waiting (its rows
        say for what), before the session's waiting messages are looked at."""
        recorder = self._recorder(session, turn_id, started=started)
        recorder.adopt_round(round_rows)
        self._turn_ends[turn_id] = asyncio.get_running_loop().create_future()
        state = self.state(session.id)
        self._run(session, state, recorder, resuming=True)
        self.ownership.resumed(session.id, turn_id, self._stopper(state, recorder))

    def _turn_ended(self, turn_id: str) -> None:
        ended = self._turn_ends.pop(turn_id, None)
        if ended is not None and not ended.done():
            ended.set_result(None)

    async def _turn_task(
        self,
        session: ChatSessionRow,
        state: SessionState,
        recorder: TurnRecorder,
        resuming: bool,
    ) -> None:
        try:
            with observe_turn(session.id, recorder.turn_id, session.model) as observed:
                prepare = self._agent.prepare(
                    session,
                    recorder.turn_id,
                    should_pause=state.wants_breakpoint,
                    inbox=state.inbox,
                    resuming=resuming,
                    history=recorder.rows.take_history(),
                )
                await run_turn(prepare, recorder)
                observed.status = recorder.closed_status
        finally:
            if state.inbox is not None:
                state.inbox.close()
            await self._after_turn(session.id, state)

    async def _after_turn(self, session_id: str, state: SessionState) -> None:
        """The turn is closed: take everything waiting as the next turn, or go idle."""
        if state.recorder is not None:
            recorder = state.recorder
            await self.ownership.turn_over(session_id, recorder.turn_id, detached=recorder.detached)
            self._stopping.discard(recorder.turn_id)
        try:
            async with state.lock:
                state.task = state.recorder = state.inbox = None  # idle: nothing of its last turn is kept
                self._notifier.running(session_id, False)
                # `waiting` mirrors the waiting line's rows (kept under this lock): nothing waits, no read.
                if not self._closing and not state.closed and not await self._line_empty(session_id, state):
                    await self._take_or_retry(session_id, state)
        finally:
            self.sessions.rested(session_id, state)
            if state.task is None:  # no next turn started here: the fan-out reads its stream again
                self._notifier.turn_over(session_id)

    async def _take_or_retry(self, session_id: str, state: SessionState) -> None:
        try:
            await self._take_waiting(session_id, state)
        except Exception as exc:
            if storage_refusal(exc) is None:
                log.exception("taking the waiting messages of session %s failed", session_id)
                return
            # They stay waiting, first in line: the next post takes them, and so does this retry.
            log.error("session %s: its waiting messages wait for storage (%s)", session_id, exc)
            asyncio.get_running_loop().call_later(TAKE_RETRY_SECONDS, self._retry_take, session_id, state)

    def _retry_take(self, session_id: str, state: SessionState) -> None:
        if state.task is None and state.waiting and self._states.get(session_id) is state:
            task = asyncio.create_task(self._after_turn(session_id, state), name=f"take:{session_id}")
            self._retries.add(task)
            task.add_done_callback(self._retries.discard)

    async def _line_empty(self, session_id: str, state: SessionState) -> bool:
        """Whether nothing waits in the session's line: its mirror here, or (leased: other replicas add to
        it) its table, read into the mirror."""
        if self.ownership.line_here:
            return not state.waiting
        async with self._database.read() as db:
            rows = await repository.queued(db, session_id)
        state.waiting = {row.id: queued_message(row) for row in rows}
        return not rows

    async def _may_open(self, session_id: str, state: SessionState) -> bool:
        """A post opens a turn if nothing waits. Leased, the claim refuses the turn (TurnBusy) when messages
        wait, in the transaction that opens it: reading the line first cost every post a pooled connection
        of its own, which under a burst of posts was most of its wait (bench: 100-550 ms of a POST's 0.5 s
        at 250 sessions)."""
        return await self._line_empty(session_id, state) if self.ownership.line_here else True

    async def _take_waiting(self, session_id: str, state: SessionState) -> None:
        async with self._database.read() as db:
            session = await repository.get_session(db, session_id)
            rows = await repository.queued(db, session_id) if session is not None else []
        if session is None or not rows:
            return
        messages = [queued_message(r) for r in rows]
        # TurnBusy (leased): the running turn's owner takes them when it ends (or a sweeper, if it dies).
        with suppress(TurnBusy):
            await self._start_turn(session, state, messages, from_queue=True)

    # --- waiting for turns ---------------------------------------------------------------------------

    async def turn_end(self, turn_id: str) -> None:
        """Returns once the turn is over, its turn_done committed; at once if it is not running here."""
        ended = self._turn_ends.get(turn_id)
        if ended is not None:
            # Shielded: a caller that stops waiting leaves the future to the others.
            await asyncio.shield(ended)

    async def taker(self, session_id: str, message_id: str) -> str | None:
        """The turn that took the message, once one has; None if none will (withdrawn, deleted, shut down)."""
        state = self._states.get(session_id)
        if state is not None and message_id in state.waiting and not self._closing:
            future = state.takers.setdefault(message_id, asyncio.get_running_loop().create_future())
            return await asyncio.shield(future)
        async with self._database.read() as db:
            row = await repository.get_message(db, message_id)
        return row.turn_id if row is not None and row.session_id == session_id else None

    async def answer(self, session_id: str, kind: Kind, items: list[dict[str, Any]]) -> list[Resolution]:
        """Hands answers to the session's running turn; returns once committed (409: no turn runs here)."""
        state = self._states.get(session_id)
        if state is None or state.inbox is None or state.task is None:
            raise NoPendingCall(
                "No turn of this session waits for an answer.", details={"session_id": session_id}
            )
        return await asyncio.shield(state.inbox.submit(kind, items))

    # --- the waiting line ----------------------------------------------------------------------------

    async def queue(self, session_id: str) -> list[QueuedMessage]:
        async with self._database.read() as db:
            rows = await repository.queued(db, session_id)
        return [queued_message(r) for r in rows]

    async def withdraw(self, session_id: str, message_ids: list[str] | None = None) -> list[QueuedMessage]:
        """Takes messages out of the waiting line (all of them when `message_ids` is None)."""
        async with self.sessions.held(session_id) as state:
            return await withdraw(self._writer, state, session_id, await self.queue(session_id), message_ids)

    # --- stopping ------------------------------------------------------------------------------------

    async def cancel(self, session_id: str, *, clear_queue: bool = False) -> CancelResult:
        state = self._states.get(session_id)
        if state is None or state.task is None:
            # No turn of it runs here: one may run elsewhere (leased), which its ownership stops.
            withdrawn = await self.withdraw(session_id) if clear_queue else []
            result = await self.ownership.cancel_elsewhere(session_id)
            if result is None:
                return CancelResult(cancelled=False, withdrawn=withdrawn)
            return result.model_copy(update={"withdrawn": withdrawn})
        if state.recorder is not None:
            self._stopping.add(state.recorder.turn_id)
        withdrawn = await self.withdraw(session_id) if clear_queue else []
        state = self._states.get(session_id)
        if state is None or state.task is None or state.recorder is None:
            return CancelResult(cancelled=False, withdrawn=withdrawn)
        task, recorder = state.task, state.recorder
        stopping = recorder.request_stop()
        if stopping:
            turn_cancelled()
        # Either way the turn is ending: wait until its end (and the taking of waiting messages) is done,
        # or until storage refuses to take that end (then the answer says so, not that it was stopped).
        stalled = asyncio.ensure_future(recorder.stall())
        try:
            await asyncio.wait({task, stalled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stalled.cancel()
        if not task.done() and recorder.stalled is not None:
            raise end_not_stored(recorder.stalled, stopping=stopping)
        if not stopping:
            return CancelResult(cancelled=False, withdrawn=withdrawn)
        return CancelResult(
            cancelled=True,
            turn_id=recorder.turn_id,
            interrupted_message_ids=recorder.interrupted_message_ids,
            interrupted_tool_call_ids=recorder.interrupted_tool_call_ids,
            withdrawn=withdrawn,
        )

    async def take_waiting(self, session_id: str) -> None:
        """Starts the session's waiting messages unless a turn of it runs (at startup; for a sweeper)."""
        if self._closing:
            return
        async with self.sessions.held(session_id) as state:
            if state.task is None and not state.closed:
                await self._take_waiting(session_id, state)

    async def delete_session(self, session_id: str) -> None:
        """Stops the turn and deletes the session, its history, log and streams (is_closed from the stop)."""
        self.state(session_id).closed = True
        await self.cancel(session_id)
        self._writer.forget_session(session_id)
        async with self._database.session() as db:
            held = await files.session_blobs(db, session_id)
            await repository.delete_session(db, session_id)
            await db.commit()
        await self._blobs.forget(held)
        self.forget(session_id)

    def forget(self, session_id: str) -> None:
        """The session is gone (deleted here or by another replica): its state here and its streams end."""
        state = self.sessions.forget(session_id)
        if state is not None:
            state.closed = True
            state.resolve_takers(list(state.takers), None)
        self._live.forget(session_id)
        self._fanout.drop(session_id)

    async def shutdown(self) -> None:
        """The server stops the turns, not a user: they end as interrupted, their partial state kept."""
        self._closing = True
        for state in self._states.values():
            # Waiting messages stay in the line for the next start; their callers stop waiting now.
            state.resolve_takers(list(state.takers), None)
        running = [sid for sid, s in self._states.items() if s.task is not None]
        for sid in running:
            recorder = self._states[sid].recorder
            if recorder is not None:
                recorder.request_stop(by_server=True)
        await asyncio.gather(*(self.cancel(sid) for sid in running), return_exceptions=True)

    # --- what other replicas ask of this one's turns (turns.runtime.ownership.TurnsHere) ----------------

    def runs_turn(self, turn_id: str) -> bool:
        return self._session_of(turn_id) is not None

    def _session_of(self, turn_id: str) -> str | None:
        for session_id, state in self._states.items():
            if state.task is not None and state.recorder is not None and state.recorder.turn_id == turn_id:
                return session_id
        return None

    def cancel_local(self, turn_id: str) -> bool:
        """Stops the turn as a user's cancel does, if it runs here; whether it does. Returns at once."""
        session_id = self._session_of(turn_id)
        if session_id is None:
            return False
        if turn_id in self._stopping:
            return True  # a stop is under way already: no second cancel, no second agent_cancelled
        self._stopping.add(turn_id)
        log.info("turn %s: cancelled from another replica", turn_id)
        self._spawn(self.cancel(session_id), f"cancel:{turn_id}")
        return True

    async def reread_line(self, session_id: str) -> None:
        """Another replica added to the session's waiting line: the turn running here reads it again, so
        a steer is taken at its next breakpoint (SessionState.wants_breakpoint reads this mirror) and an
        interrupt stops it, as when they are posted here."""
        state = self._states.get(session_id)
        if state is None or state.task is None:
            return
        async with state.lock:
            recorder = state.recorder
            if state.task is None or recorder is None:
                return  # the turn ended meanwhile: its end read the line
            async with self._database.read() as db:
                rows = await repository.queued(db, session_id)
            state.waiting = {row.id: queued_message(row) for row in rows}
        if any(row.delivery == "interrupt" for row in rows):
            log.info("turn %s: interrupted by a message posted on another replica", recorder.turn_id)
            self.cancel_local(recorder.turn_id)

    def waiting_noticed(self, session_id: str, urgent: set[str]) -> None:
        """The heartbeat found steer or interrupt messages waiting for a turn of this replica."""
        state = self._states.get(session_id)
        if state is None or urgent <= state.waiting.keys():
            return  # all of them known here already
        self._spawn(self.reread_line(session_id), f"reread:{session_id}")

    def _spawn(self, work: Coroutine[Any, Any, Any], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._background.add(task)
        task.add_done_callback(_settled(self._background))


def _settled(tasks: set[asyncio.Task[Any]]) -> Any:
    def done(task: asyncio.Task[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s (a request from another replica) failed: %s", task.get_name(), task.exception())

    return done
