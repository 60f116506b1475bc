"""Who runs a session's turn: the Runner (turns.runner) asks its Ownership, one of two.

- `LocalOwnership`: one process owns every session. A turn is this process's if its task runs here; the
  waiting line's mirror in the process is the line; nothing runs elsewhere, so nothing is cancelled there.
- `LeasedOwnership` (multi-replica mode): a turn is owned through its lease (turns.lease). Opening a turn
  claims the lease in the same transaction (a second running turn of a session is refused by the database,
  TurnBusy, and the message waits in the durable line instead); the lease is held by the fence from that
  commit on, so every write of the turn is fenced and the heartbeat renews it; the waiting line is read
  from its table, not this process's mirror, since other replicas add to it; a cancel of a turn that runs
  elsewhere sets its durable flag and waits for its end; a lost lease stops the local turn at once; the
  heartbeat hands the runner the cancel flags and waiting steer and interrupt messages it finds
  (`TurnsHere`).

The Runner makes its Ownership in its constructor, handing it itself as `TurnsHere`: the heartbeat calls
back into the runner, and the runner calls the ownership, with nothing set on either afterwards.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from sqlmodel.ext.asyncio.session import AsyncSession

from app.protocol.schemas import CancelResult
from app.settings import Settings
from app.storage.engine import Database
from app.streaming.fencing import Fence, Lease
from app.turns.lease import LeaseKeeper

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


class LeasedOwnership:
    """Turns owned through leases and fenced (see the module's docstring)."""

    line_here = False

    def __init__(self, settings: Settings, database: Database, fence: Fence, turns: TurnsHere) -> None:
        self.fence = fence
        self.keeper = LeaseKeeper(
            settings, database, fence, on_cancel=turns.cancel_local, on_waiting=turns.waiting_noticed
        )
        # Leases claimed by opening transactions, held once those commit.
        self._claimed: dict[str, Lease] = {}

    def claim(self, session_id: str, turn_id: str, *, posted: bool) -> Claim | None:
        async def claim(db: AsyncSession) -> None:
            lease = await self.keeper.claim(db, session_id, turn_id, unless_waiting=posted)
            self._claimed[turn_id] = lease

        return claim

    def opened(self, session_id: str, turn_id: str, stop: Callable[[], object]) -> None:
        # Held from its commit on, before the turn's task takes its first step: every write it makes is
        # fenced, and the heartbeat renews it. A lost lease stops the local turn (Fence.lose).
        lease = self._claimed.pop(turn_id, None)
        if lease is not None:
            lease.stop = stop
            self.fence.hold(lease)

    def not_opened(self, turn_id: str) -> None:
        self._claimed.pop(turn_id, None)

    def resumed(self, session_id: str, turn_id: str, stop: Callable[[], object]) -> None:
        lease = self.fence.lease(session_id)  # the sweeper holds it since its takeover
        if lease is not None and lease.turn_id == turn_id:
            lease.stop = stop

    async def turn_over(self, session_id: str, turn_id: str, *, detached: bool) -> None:
        if detached:
            # A shutdown left it waiting for answers: the next sweep of another replica resumes it.
            await self.keeper.let_go(session_id, turn_id)
        self.fence.end(session_id, turn_id)

    async def cancel_elsewhere(self, session_id: str) -> CancelResult | None:
        return await self.keeper.cancel_elsewhere(session_id)
