"""The stop protocol of a running turn: a stop (a user's cancel, an interrupt, a shutdown) cancels the
turn's task only between the recorder's writes, never inside one. A write cut in half would leave a row
without its result, or state that disagrees with the database (a call noted as not started whose row
exists, a text rolled back but detached). It also says how a stop is recorded: by a user (cancelled,
TOOL_INTERRUPTED_BY_USER), or by the server shutting down (interrupted, TOOL_INTERRUPTED_BY_RESTART).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from app.protocol.events import TurnStatus

TOOL_INTERRUPTED_BY_USER = "[Tool execution interrupted by user]"
TOOL_INTERRUPTED_BY_ERROR = "[Tool execution interrupted by an error]"
TOOL_INTERRUPTED_BY_RESTART = "[Tool execution interrupted by server restart]"


@dataclass
class TurnStop:
    # How a stop is recorded: by a user (cancelled), or by the server shutting down (interrupted).
    status: TurnStatus = "cancelled"
    tool_result: str = TOOL_INTERRUPTED_BY_USER
    task: asyncio.Task[None] | None = None
    writing: int = 0
    requested: bool = False
    # The turn is ending (a stop, a failure, a close after a restart): a stop asked now changes nothing.
    finishing: bool = False
    # A completed turn's end waits for its turn to write: a stop is taken, and that end records it.
    ending: bool = False
    # The task has taken its first step: before it, a cancel would end it without running its body (and
    # the turn would never close), so a stop is only noted and the task acts on it when it begins.
    begun: bool = False
    # A shutdown while calls wait: the task ends without closing the turn, which resumes after the
    # restart from its rows (turns.suspended).
    detach: bool = False

    def request(self, *, by_server: bool, suspended: bool) -> bool:
        """Stops the turn as soon as no write is in progress. False when it is already ending by itself.
        A stop `by_server` (shutdown) records the turn as interrupted rather than cancelled, or leaves it
        suspended when it waits for answers (`suspended`)."""
        if by_server:
            self.status = "interrupted"
            self.tool_result = TOOL_INTERRUPTED_BY_RESTART
            self.detach = suspended
        if self.finishing:
            return False
        if not self.requested:
            self.requested = True
            if self.begun and not self.writing and not self.ending and self.task is not None:
                self.task.cancel()
        return True

    def begin(self) -> bool:
        """Called first by the turn's task: from now on a stop cancels it. True when a stop came before."""
        self.begun = True
        return self.requested

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """One write of the recorder: a stop that arrives during it takes effect once it is done."""
        self.writing += 1
        try:
            yield
        finally:
            self.writing -= 1
        if self.requested and not self.writing and not self.finishing:
            # The stop that arrived during the write takes effect now, where the state is whole.
            raise asyncio.CancelledError
