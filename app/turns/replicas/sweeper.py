"""The sweeper (multi-replica mode), on every replica: closes the turns whose owner stopped renewing its
lease, exactly as crash recovery closes a turn at a restart (turns.recovery.close_left_turn: the partial
text kept and marked, open tool calls given the interrupted result, turn_done interrupted; cancelled, as
the user's stop would have closed it, when a cancel was flagged on the lease), then starts the session's
waiting messages here; and starts the waiting messages of any session no turn runs for.

A turn suspended while it waits for answers (a client tool's result, a person's decision) is not closed:
it is handed over. The sweeper that took its lease resumes it here as a restart resumes it
(turns.recovery.resume_turn: same requests, same expiry), and answers sent to any replica reach it here.
A replica shutting down lets such a lease go at once (LeaseKeeper.let_go), so the handover takes a sweep,
not the rest of the lease.

A lease is taken over before its turn is closed: an UPDATE that gives it this replica's new token only
if it is still expired and still under the old one, so of several sweepers exactly one closes it, and
the old owner, should it wake up, writes nothing more (streaming.log.fencing). On PostgreSQL the takeover
never overlaps a write of the old owner that is in flight, nor waits for it: a lease whose row the owner
holds locked is skipped, and taken at a later pass, once that write landed (the close then sees it) or
PostgreSQL ended the transaction of an owner paused in it (PARLEY_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_MS,
shorter than a lease). Each lease is swept on its own: one that fails or is locked holds up no other.
"""

from __future__ import annotations

import asyncio
import logging

from app.storage import leases, pending
from app.storage.engine import Database
from app.streaming.log.fencing import Lease
from app.streaming.log.write_behind import WriteBehind
from app.turns.live import LiveStatusBoard
from app.turns.recovery import close_left_turn, resume_turn
from app.turns.replicas.lease import LeaseKeeper, new_token
from app.turns.runtime.runner import Runner

log = logging.getLogger(__name__)


class Sweeper:
    def __init__(
        self,
        database: Database,
        writer: WriteBehind,
        live: LiveStatusBoard,
        runner: Runner,
        keeper: LeaseKeeper,
    ) -> None:
        self._database = database
        self._writer = writer
        self._live = live
        self._runner = runner
        self._keeper = keeper
        # No longer than the heartbeat: a dead owner's turn is closed at most a beat after its lease ends.
        self.interval = keeper.interval
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="lease-sweeper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.sweep()
            except Exception:  # the read of what to sweep: each lease has its own handling
                log.exception("lease sweep failed; retrying")

    async def sweep(self) -> int:
        """One pass; returns how many turns it took over (closed, or resumed here). Each expired lease and
        each idle session is handled on its own (`_sweep_lease`, `_take_idle`): one that fails, or that
        its owner still holds locked, is left to the next pass, and the others are not held up by it."""
        async with self._database.session() as db:
            expired = await leases.expired(db)
        taken = 0
        for record in expired:
            if self._runner.closing:
                # Shutting down (the drain starts at the signal, before the lifespan stops this sweeper):
                # a lease this replica just let go is another replica's to take, not its own again.
                return taken
            if await self._sweep_lease(record):
                taken += 1
        async with self._database.session() as db:
            idle = await leases.sessions_waiting_without_turn(db)
        for session_id in idle:
            await self._take_idle(session_id)
        return taken

    async def _sweep_lease(self, record: leases.LeaseRecord) -> bool:
        """One expired lease, in transactions of its own: taken over (its turn closed, or resumed here),
        then the session's waiting messages started. Whether it was taken; a failure is logged, and the
        lease is left to the next pass."""
        if self._runner.runs_turn(record.turn_id):
            return False  # this replica's own: its heartbeat stops it, then a sweep closes it
        try:
            taken = await self._take_over(record)
            await self._runner.take_waiting(record.session_id)
        except Exception:
            log.exception(
                "lease sweep: turn %s of session %s failed; retried at the next pass",
                record.turn_id,
                record.session_id,
            )
            return False
        return taken

    async def _take_idle(self, session_id: str) -> None:
        """Starts the waiting messages of a session no turn runs for; a failure waits for the next pass."""
        try:
            await self._runner.take_waiting(session_id)
        except Exception:
            log.exception("lease sweep: the waiting messages of session %s failed to start", session_id)

    async def _take_over(self, record: leases.LeaseRecord) -> bool:
        """Takes the expired lease; then resumes its turn here if it waits for answers, else closes it.
        False when another replica took it first, or its owner holds its row locked (a later pass)."""
        token = new_token()
        async with self._database.session() as db:
            flagged = await leases.take_over(db, record, self._keeper.replica_id, token, self._keeper.seconds)
            suspended = bool(await pending.suspended_turns(db, record.turn_id))
            await db.commit()
        if flagged is None:
            return False
        lease = Lease(record.turn_id, record.session_id, token)
        fence = self._keeper.fence
        fence.hold(lease)
        # Held from here on: renewed by this replica's heartbeat, released by the resumed turn's end.
        if suspended and not flagged and await self._resume(record):
            return True
        try:
            closed = await close_left_turn(
                self._database, self._writer, self._live, record.session_id, record.turn_id, cancelled=flagged
            )
            if not closed:  # its end was written already: only the lease is left to release
                async with self._database.session() as db:
                    await leases.release(db, token)
                    await db.commit()
        except Exception:
            # Not closed: the lease goes back to the sweepers at once (the next pass tries again), not a
            # lease later.
            await self._keeper.let_go(record.session_id, record.turn_id)
            raise
        finally:
            fence.end(record.session_id, record.turn_id)
        log.warning(
            "closed turn %s of session %s (%s): its owner's lease expired",
            record.turn_id,
            record.session_id,
            "cancelled, as its flag asked" if flagged else "interrupted",
        )
        return True

    async def _resume(self, record: leases.LeaseRecord) -> bool:
        try:
            resumed = await resume_turn(self._database, self._runner, record.turn_id)
        except Exception:
            log.exception("turn %s could not be resumed here; closing it", record.turn_id)
            return False
        if resumed:
            log.warning(
                "took over turn %s of session %s, which waits for answers: its owner's lease expired",
                record.turn_id,
                record.session_id,
            )
        return resumed
