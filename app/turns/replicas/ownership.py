"""Turns owned through leases (multi-replica mode): the Ownership (turns.runtime.ownership) a replica's
Runner is given. Opening a turn claims its lease in the same transaction; the fence holds it from that
commit on (every write of the turn is fenced, the heartbeat renews it); a lost lease stops the local
turn; the line is read from its table; a cancel of a turn that runs elsewhere sets its durable flag and
waits for its end (turns.replicas.lease)."""

from __future__ import annotations

from collections.abc import Callable

from sqlmodel.ext.asyncio.session import AsyncSession

from app.protocol.schemas import CancelResult
from app.settings import Settings
from app.storage.engine import Database
from app.streaming.log.fencing import Fence, Lease
from app.turns.replicas.lease import LeaseKeeper
from app.turns.runtime.ownership import Claim, TurnsHere


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
