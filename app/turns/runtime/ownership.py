"""Who runs a session's turn: the Runner (turns.runtime.runner) asks its Ownership, one of two.

- `LocalOwnership`: one process owns every session. A turn is this process's if its task runs here; the
  waiting line's mirror in the process is the line; nothing runs elsewhere, so nothing is cancelled there.
- `LeasedOwnership` (multi-replica mode, turns.replicas.ownership): a turn is owned through its lease
  (turns.replicas.lease). Opening a turn claims the lease in the same transaction (a second running turn of a
  session is refused by the database, TurnBusy, and the message waits in the durable line instead); the lease
  is held by the fence from that commit on, so every write of the turn is fenced and the heartbeat renews it;
  the waiting line is read from its table, not this process's mirror, since other replicas add to it; a cancel
  of a turn that runs elsewhere sets its durable flag and waits for its end; a lost lease stops the local turn
  at once; the heartbeat hands the runner the cancel flags and waiting steer and interrupt messages it finds
  (`TurnsHere`).

The Runner makes its Ownership in its constructor, handing it itself as `TurnsHere`: the heartbeat calls
back into the runner, and the runner calls the ownership, with nothing set on either afterwards.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from sqlmodel.ext.asyncio.session import AsyncSession

from app.protocol.schemas import CancelResult

# The claim of a turn's lease, first thing in the transaction that opens it (TurnRecorder.claim).
Claim = Callable[[AsyncSession], Awaitable[None]]


class TurnsHere(Protocol):
    """What an Ownership asks of this process's turns (the Runner)."""

    def cancel_local(self, turn_id: str) -> bool:
        """Stops the turn as a user's cancel does, if it runs here; whether it does."""
        ...

    def waiting_noticed(self, session_id: str, urgent: set[str]) -> None:
        """Steer or interrupt messages (`urgent`, their ids) wait for the session's turn running here."""
        ...


class Ownership(Protocol):
    # Whether this process's mirror of a session's waiting line is the line (else: its table).
    line_here: bool

    def claim(self, session_id: str, turn_id: str, *, posted: bool) -> Claim | None:
        """What the transaction that opens the turn runs first (None: nothing). `posted`: opened by a post,
        which is refused too while messages wait in the line."""
        ...

    def opened(self, session_id: str, turn_id: str, stop: Callable[[], object]) -> None:
        """The opening transaction committed (or failed: `not_opened`). `stop` stops the local turn."""
        ...

    def not_opened(self, turn_id: str) -> None: ...

    def resumed(self, session_id: str, turn_id: str, stop: Callable[[], object]) -> None:
        """A turn taken over (a sweeper's, whose lease it holds already) or left by a restart runs here
        again. `stop` stops it."""
        ...

    async def turn_over(self, session_id: str, turn_id: str, *, detached: bool) -> None:
        """The turn's task ended here (`detached`: left waiting for answers by a shutdown)."""
        ...

    async def cancel_elsewhere(self, session_id: str) -> CancelResult | None:
        """A cancel of a session with no turn running here: the turn of another process, stopped and its
        result; None when none runs."""
        ...


MakeOwnership = Callable[[TurnsHere], Ownership]


class LocalOwnership:
    """One process owns every session (see the module's docstring)."""

    line_here = True

    def __init__(self, turns: TurnsHere) -> None:
        del turns  # nothing comes from elsewhere to act on

    def claim(self, session_id: str, turn_id: str, *, posted: bool) -> Claim | None:
        return None

    def opened(self, session_id: str, turn_id: str, stop: Callable[[], object]) -> None:
        return None

    def not_opened(self, turn_id: str) -> None:
        return None

    def resumed(self, session_id: str, turn_id: str, stop: Callable[[], object]) -> None:
        return None

    async def turn_over(self, session_id: str, turn_id: str, *, detached: bool) -> None:
        return None

    async def cancel_elsewhere(self, session_id: str) -> CancelResult | None:
        return None
