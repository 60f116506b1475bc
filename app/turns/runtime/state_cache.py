"""The sessions a process keeps state for: every session while it is in use, and an idle one only for a while.

A `SessionState` (turns.runtime.session_state) is made the first time a session is used here. Kept forever, a
replica that
serves sessions for weeks would hold one for every session it ever ran (with the writer's cached event
number of each: ~850 bytes a session, measured with 3,000 sessions of one turn each). So a state that
has rested `keep_seconds` (no turn, no caller, nothing waiting on it) is dropped, with what the writer
caches for the session (`let_go`); the next use makes a fresh one and reads the session's last event
number from the log.

Dropping a state is safe only if nobody can still use the old one, or two states of one session would
run two turns: every caller that waits for a state's lock holds it through `held`, which counts it as in
use from before it waits; a state in use, locked, running a turn or holding callers is never dropped.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from app.observability.hooks import session_memory
from app.turns.runtime.session_state import SessionState

IDLE_KEEP_SECONDS = 300.0


class SessionStates:
    """This process's `SessionState`s by session id, dropping those that rested `keep_seconds`."""

    def __init__(
        self,
        states: dict[str, SessionState],
        let_go: Callable[[str], None],
        *,
        line_here: bool = True,
        keep_seconds: float = IDLE_KEEP_SECONDS,
    ) -> None:
        self._states = states
        self._let_go = let_go
        # Whether a state's `waiting` is the line itself (one process), or a mirror of its table (several
        # replicas: messages that wait there are another replica's to take, and are read again anyway).
        self._line_here = line_here
        self.keep_seconds = keep_seconds
        # Sessions whose state went idle, oldest first, with when.
        self._rested: dict[str, float] = {}

    def state(self, session_id: str) -> SessionState:
        state = self._states.get(session_id)
        if state is None:
            state = self._states[session_id] = SessionState()
            session_memory(states=1)
        return state

    def forget(self, session_id: str) -> SessionState | None:
        """The session is gone (deleted): its state goes at once."""
        state = self._states.pop(session_id, None)
        if state is not None:
            session_memory(states=-1)
        return state

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._states

    @asynccontextmanager
    async def held(self, session_id: str) -> AsyncIterator[SessionState]:
        """The session's state under its lock, counted as in use from before the wait for that lock."""
        state = self.state(session_id)
        state.users += 1
        try:
            async with state.lock:
                yield state
        finally:
            state.users -= 1
            self.rested(session_id, state)

    def rested(self, session_id: str, state: SessionState) -> None:
        """Called when a use of the state ended: if it is idle now, its rest starts; old rests end."""
        now = time.monotonic()
        if self._idle(state):
            self._rested.pop(session_id, None)
            self._rested[session_id] = now
        self.drop_rested(now)

    def drop_rested(self, now: float) -> None:
        """Drops the states that have been idle `keep_seconds` and still are."""
        limit = now - self.keep_seconds
        rested = self._rested
        while rested:
            session_id, since = next(iter(rested.items()))
            if since > limit:
                return
            del rested[session_id]
            state = self._states.get(session_id)
            if state is not None and self._idle(state):
                del self._states[session_id]
                session_memory(states=-1)
                self._let_go(session_id)

    def _idle(self, state: SessionState) -> bool:
        return (
            state.users == 0
            and state.task is None
            and not state.lock.locked()
            and not state.takers
            and not state.closed
            and state.inbox is None
            and (not state.waiting or not self._line_here)
        )
