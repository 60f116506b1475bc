"""The runner of one replica among several (multi-replica mode): the same turns, owned through leases.

What changes from the single-process runner (turns.runner): opening a turn claims its lease in the same
transaction (a second running turn of a session is refused by the database, and the message waits in
the durable line instead); the waiting line is read from its table, not this process's mirror, since
other replicas add to it; a cancel for a turn that runs elsewhere sets its durable flag and waits for
its end; a lost lease stops the local turn at once. `cancel_local(turn_id)` is what the heartbeat calls
for a flagged turn, and what a cancel broadcast from another replica calls.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from contextlib import suppress
from typing import Any

from sqlmodel.ext.asyncio.session import AsyncSession

from app.protocol.schemas import CancelResult, QueuedMessage
from app.storage import repository
from app.storage.tables import ChatSessionRow
from app.streaming.fencing import Lease
from app.turns.control import TurnBusy, queued_message
from app.turns.idle import SessionStates
from app.turns.lease import LeaseKeeper
from app.turns.line import SessionState
from app.turns.recorder import TurnRecorder
from app.turns.runner import Runner

log = logging.getLogger(__name__)


class LeasedRunner(Runner):
    def __init__(self, *args: Any, keeper: LeaseKeeper, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The line is the table (other replicas add to it): a state's stale mirror keeps nothing alive.
        keep = self._settings.idle_session_seconds
        self.sessions = SessionStates(self._states, self._writer.let_go, line_here=False, keep_seconds=keep)
        self._keeper = self.keeper = keeper
        self._fence = keeper.fence
        self._fence.on_lost = self._stop_lost
        keeper.on_cancel = self.cancel_local
        keeper.on_waiting = self._waiting_noticed
        # Leases claimed by opening transactions, held once those commit.
        self._claimed: dict[str, Lease] = {}
        # Turns being opened by a post: their claim also checks that nothing waits in the line (_may_open).
        self._posted: set[str] = set()
        self._background: set[asyncio.Task[Any]] = set()
        # Turns of this replica a stop was asked for (a cancel, an interrupt): each is stopped once, whether
        # the request came by broadcast, by the flag on its lease, or from a waiting interrupt message.
        self._stopping: set[str] = set()
        # Called with a session once no turn of it runs here any more (the fan-out reads its stream again).
        self.on_turn_over: Callable[[str], None] | None = None

    def _recorder(self, session: ChatSessionRow, turn_id: str, **fields: Any) -> TurnRecorder:
        recorder = super()._recorder(session, turn_id, **fields)

        async def claim(db: AsyncSession) -> None:
            fresh = turn_id in self._posted
            lease = await self._keeper.claim(db, session.id, turn_id, unless_waiting=fresh)
            self._claimed[turn_id] = lease

        recorder.claim = claim
        return recorder

    async def _open_turn(
        self,
        session: ChatSessionRow,
        state: SessionState,
        messages: list[QueuedMessage],
        turn_id: str,
        *,
        from_queue: bool,
    ) -> str:
        if not from_queue:
            self._posted.add(turn_id)
        try:
            opened = await super()._open_turn(session, state, messages, turn_id, from_queue=from_queue)
        finally:
            lease = self._claimed.pop(turn_id, None)
            self._posted.discard(turn_id)
        if not from_queue:
            state.waiting.clear()  # the claim found the line empty; a stale mirror would pause the turn
        # Held from its commit on, before the turn's task takes its first step: every write it makes is
        # fenced, and the heartbeat renews it.
        if lease is not None:
            self._fence.hold(lease)
        return opened

    async def _line_empty(self, session_id: str, state: SessionState) -> bool:
        async with self._database.read() as db:
            rows = await repository.queued(db, session_id)
        state.waiting = {row.id: queued_message(row) for row in rows}
        return not rows

    async def _may_open(self, session_id: str, state: SessionState) -> bool:
        # The claim refuses the turn (TurnBusy) when messages wait, in the transaction that opens it:
        # reading the line first cost every post a pooled connection of its own, which under a burst
        # of posts was most of its wait (bench: 100-550 ms of a POST's 0.5 s at 250 sessions).
        return True

    async def _take_waiting(self, session_id: str, state: SessionState) -> None:
        # TurnBusy: the running turn's owner takes them when it ends (or a sweeper, if it dies).
        with suppress(TurnBusy):
            await super()._take_waiting(session_id, state)

    async def _after_turn(self, session_id: str, state: SessionState) -> None:
        if state.recorder is not None:
            if state.recorder.detached:
                # A shutdown left it waiting for answers: the next sweep of another replica resumes it.
                await self._keeper.let_go(session_id, state.recorder.turn_id)
            self._fence.end(session_id, state.recorder.turn_id)
            self._stopping.discard(state.recorder.turn_id)
        try:
            await super()._after_turn(session_id, state)
        finally:
            if state.task is None and self.on_turn_over is not None:
                self.on_turn_over(session_id)

    async def _interrupt(self, session_id: str) -> None:
        # A turn of another replica: its owner stops it once it reads the waiting interrupt (notified by
        # turns.replicas, or at its next heartbeat); if the owner is gone, the sweeper closes the turn.
        if self.runs(session_id):
            await super()._interrupt(session_id)

    async def cancel(self, session_id: str, *, clear_queue: bool = False) -> CancelResult:
        state = self._states.get(session_id)
        if state is not None and state.task is not None:
            if state.recorder is not None:
                self._stopping.add(state.recorder.turn_id)
            return await super().cancel(session_id, clear_queue=clear_queue)
        withdrawn = await self.withdraw(session_id) if clear_queue else []
        result = await self._keeper.cancel_elsewhere(session_id)
        if result is None:
            return CancelResult(cancelled=False, withdrawn=withdrawn)
        return result.model_copy(update={"withdrawn": withdrawn})

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

    def _waiting_noticed(self, session_id: str, urgent: set[str]) -> None:
        """The heartbeat found steer or interrupt messages waiting for a turn of this replica."""
        state = self._states.get(session_id)
        if state is None or urgent <= state.waiting.keys():
            return  # all of them known here already
        self._spawn(self.reread_line(session_id), f"reread:{session_id}")

    def _spawn(self, work: Coroutine[Any, Any, Any], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._background.add(task)
        task.add_done_callback(_settled(self._background))

    def _stop_lost(self, lease: Lease) -> None:
        state = self._states.get(lease.session_id)
        if state is not None and state.recorder is not None and state.recorder.turn_id == lease.turn_id:
            state.recorder.request_stop(by_server=True)


def _settled(tasks: set[asyncio.Task[Any]]) -> Any:
    def done(task: asyncio.Task[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s (a request from another replica) failed: %s", task.get_name(), task.exception())

    return done
