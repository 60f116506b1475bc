"""Fencing (multi-replica mode): the leases of the turns this replica runs, checked inside every
transaction that writes one of them, so a replica that lost a lease writes nothing of that turn.

A turn's write (`WriteBehind.transaction(turn_id=...)`) goes through only if the turn's lease is still
alive under this replica's token when the transaction runs; on PostgreSQL the lease row stays locked
(FOR KEY SHARE) to the commit, so a takeover never overlaps the write: it leaves the lease to a later
sweep (turns.replicas.sweeper), and PostgreSQL ends the transaction of a replica paused in it after
PARLEY_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_MS, before its leases expire. Its last write
(turn_done) releases the lease in the same transaction. A batch of the write-behind drops the text and
events of every session whose lease it finds lost. Each refusal is counted (`rejected`, and the metric
parley_fenced_writes_total by what was refused) and logged with the turn: a zombie replica's refusals
are there to read.

A lost lease stays held (marked lost) until the runner ends it, so what the stopped turn still emits is
dropped too, never written unfenced.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sqlmodel.ext.asyncio.session import AsyncSession

from app.observability.hooks import fenced_write
from app.storage import leases

log = logging.getLogger(__name__)


class LeaseLost(RuntimeError):
    """A write of a turn whose lease this replica no longer holds: nothing of it was written."""

    def __init__(self, turn_id: str) -> None:
        super().__init__(f"turn {turn_id}: this replica no longer holds its lease")
        self.turn_id = turn_id


@dataclass
class Lease:
    turn_id: str
    session_id: str
    token: int
    lost: bool = False
    # Stops the local turn once the lease is found lost (the runner's, given when the turn opens or resumes
    # here: turns.runtime.ownership).
    stop: Callable[[], object] | None = None


class Fence:
    def __init__(self) -> None:
        self._leases: dict[str, Lease] = {}
        # Writes refused because their lease was lost (each logged with its turn).
        self.rejected = 0

    def hold(self, lease: Lease) -> None:
        self._leases[lease.session_id] = lease

    def end(self, session_id: str, turn_id: str) -> None:
        """The turn is over here (released, or its task ended): its lease is no longer held."""
        lease = self._leases.get(session_id)
        # A lost one stays until another turn of the session replaces it: what its turn emitted before it
        # stopped is still pending, and each batch drops it (`screen`) instead of writing it unfenced.
        if lease is not None and lease.turn_id == turn_id and not lease.lost:
            del self._leases[session_id]

    def lease(self, session_id: str) -> Lease | None:
        return self._leases.get(session_id)

    def held(self) -> list[Lease]:
        """The leases to renew."""
        return [lease for lease in self._leases.values() if not lease.lost]

    def lose(self, lease: Lease, why: str) -> None:
        """The lease is gone: its turn stops. Only a lease still held: a heartbeat reads which leases to
        renew before it renews them, and a turn that ended in between released its own (not lost)."""
        if lease.lost or self._leases.get(lease.session_id) is not lease:
            return
        lease.lost = True
        log.warning(
            "turn %s of session %s lost its lease (%s): it stops here", lease.turn_id, lease.session_id, why
        )
        if lease.stop is not None:
            lease.stop()  # once per lease: the runner stops the local turn

    def reject(self, lease: Lease, what: str) -> None:
        """`what`: the metric's label, bounded (turn_done, turn_write, stream_batch)."""
        self.rejected += 1
        fenced_write(what)
        log.warning(
            "lease fence: rejected write of turn %s (%s); %d rejected writes in this process",
            lease.turn_id,
            what,
            self.rejected,
        )

    async def screen(self, db: AsyncSession, session_ids: Iterable[str]) -> set[str]:
        """A batch: the sessions (of `session_ids`) whose turn's writes must be dropped from it."""
        held = [lease for sid in session_ids if (lease := self._leases.get(sid)) is not None]
        if not held:
            return set()
        alive = await leases.alive(db, [lease.token for lease in held if not lease.lost])
        dropped = set()
        for lease in held:
            if lease.token not in alive:
                self.lose(lease, "found expired or taken over by a write")
                self.reject(lease, "stream_batch")
                dropped.add(lease.session_id)
        return dropped

    async def guard(self, db: AsyncSession, session_id: str, turn_id: str | None, *, final: bool) -> bool:
        """A transaction of the session. A write of turn `turn_id` raises LeaseLost unless its lease is
        alive (`final`: and releases it). Any other write (the waiting line) goes through; False then
        means the session's pending turn writes are to be dropped from it."""
        lease = self._leases.get(session_id)
        if lease is None:
            # No turn of the session runs here: recovery's writes of a turn without a lease, the line's.
            return True
        if turn_id is not None and lease.turn_id != turn_id:
            return True
        if not lease.lost:
            ok = await (leases.release(db, lease.token) if final else _alive(db, lease.token))
            if ok:
                return True
            self.lose(lease, "found expired or taken over by a write")
        if turn_id is not None:
            self.reject(lease, "turn_done" if final else "turn_write")
            raise LeaseLost(turn_id)
        self.reject(lease, "stream_batch")
        return False


async def _alive(db: AsyncSession, token: int) -> bool:
    return token in await leases.alive(db, [token])
