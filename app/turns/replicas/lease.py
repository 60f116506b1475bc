"""This replica's turn leases (multi-replica mode): claimed in the transaction that opens a turn, renewed on
a heartbeat, and read back for the durable cancel flag.

- A claim is an INSERT into turn_leases under a fresh random token; the unique partial index on running
  leases refuses a second running turn of a session (TurnBusy), whichever replica tries.
- Every `heartbeat_seconds` the leases this replica holds are renewed in one UPDATE. One that is not
  renewed (expired, or taken over under a new token) is lost: the fence marks it, the runner stops the
  local turn at once, and its writes are refused from then on (streaming.log.fencing). When the database
  cannot be reached for a whole lease, every lease is taken as lost: another replica may own them by now.
- A cancel posted on another replica sets the turn's `cancel_requested`; the renewal returns it, and the
  owner stops the turn as a local cancel would (`on_cancel`: the runner's `cancel_local`, which a faster
  broadcast may call as well).
- A steer or interrupt message posted on another replica waits in the session's line; each beat reads
  which of them wait for the turns held here (`on_waiting`: the runner re-reads that line, as a faster
  notice from the posting replica makes it do as well).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable

from sqlmodel.ext.asyncio.session import AsyncSession

from app.errors import STORAGE_BUSY_RETRY_AFTER, StorageBusy
from app.protocol.schemas import CancelResult
from app.settings import Settings
from app.storage import leases, repository
from app.storage.engine import Database
from app.streaming.log.fencing import Fence, Lease
from app.turns.control import TurnBusy

log = logging.getLogger(__name__)

# Seconds between reads of a turn's lease while a cancel posted here waits for its owner to stop it.
CANCEL_POLL_SECONDS = 0.1


def new_token() -> int:
    """A fencing token: random, so no two claims or takeovers share one."""
    return secrets.randbits(62) + 1


class LeaseKeeper:
    def __init__(
        self,
        settings: Settings,
        database: Database,
        fence: Fence,
        *,
        on_cancel: Callable[[str], object] | None = None,
        on_waiting: Callable[[str, set[str]], object] | None = None,
    ) -> None:
        self.replica_id = f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"
        self.seconds = settings.lease_seconds
        self.interval = settings.heartbeat_seconds
        self.fence = fence
        self._database = database
        self._task: asyncio.Task[None] | None = None
        self._last_renewal = time.monotonic()
        self._cancelled: set[int] = set()
        # A flagged turn's id: its owner stops it (the runner's cancel_local).
        self._on_cancel = on_cancel
        # (session_id, ids of its steer and interrupt messages): what a running turn's owner acts on.
        self._on_waiting = on_waiting

    async def claim(
        self, db: AsyncSession, session_id: str, turn_id: str, *, unless_waiting: bool = False
    ) -> Lease:
        """Inside the transaction that opens the turn; TurnBusy when a turn of the session runs (or, with
        `unless_waiting`, when messages wait in its line)."""
        token = new_token()
        claimed = await leases.claim(
            db, turn_id, session_id, self.replica_id, token, self.seconds, unless_waiting=unless_waiting
        )
        if not claimed:
            raise TurnBusy(session_id)
        return Lease(turn_id, session_id, token)

    def start(self) -> None:
        self._last_renewal = time.monotonic()
        self._task = asyncio.create_task(self._run(), name="lease-heartbeat")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.beat()
            except Exception as exc:
                log.error("lease heartbeat failed (%s); retrying", exc)
                if time.monotonic() - self._last_renewal >= self.seconds:
                    for lease in self.fence.held():
                        self.fence.lose(lease, "not renewed for a whole lease")

    async def beat(self) -> None:
        """Renews every lease held here; stops the turns whose lease is gone; hands on cancel flags, and
        the steer and interrupt messages waiting for its turns (posted on any replica: this read is what
        brings them without Redis)."""
        held = self.fence.held()
        started = time.monotonic()
        renewed: dict[int, bool] = {}
        urgent: dict[str, set[str]] = {}
        if held:
            async with self._database.session() as db:
                renewed = await leases.renew(db, [lease.token for lease in held], self.seconds)
                await db.commit()
                self._last_renewal = started  # renewed, even if the read below fails
                urgent = await leases.urgent_waiting(db, [lease.session_id for lease in held])
        self._last_renewal = started
        for lease in held:
            if lease.token not in renewed:
                self.fence.lose(lease, "its renewal failed: expired or taken over")
            elif renewed[lease.token] and lease.token not in self._cancelled:
                self._cancelled.add(lease.token)
                if self._on_cancel is not None:
                    self._on_cancel(lease.turn_id)
            if lease.token in renewed and lease.session_id in urgent and self._on_waiting is not None:
                self._on_waiting(lease.session_id, urgent[lease.session_id])
        self._cancelled &= {lease.token for lease in held}

    async def let_go(self, session_id: str, turn_id: str) -> None:
        """Expires the lease of a turn this replica leaves unfinished (a shutdown while it waits for
        answers), so that another replica's sweeper takes it over at its next pass, not a lease later.
        Best effort: if the database refuses, the lease expires by itself."""
        lease = self.fence.lease(session_id)
        if lease is None or lease.turn_id != turn_id or lease.lost:
            return
        try:
            async with self._database.session() as db:
                await leases.expire(db, lease.token)
                await db.commit()
        except Exception as exc:
            log.warning("turn %s: its lease could not be let go (%s); it expires by itself", turn_id, exc)

    async def cancel_elsewhere(self, session_id: str) -> CancelResult | None:
        """Flags the session's running turn (run by another replica) for cancelling, and waits until its
        owner stopped it (or, if the owner is gone, a sweeper closed it); None when no turn runs."""
        flagged = await self.flag_cancel(session_id)
        return await self.stopped(flagged) if flagged is not None else None

    async def flag_cancel(self, session_id: str) -> leases.LeaseRecord | None:
        """Sets the durable cancel flag of the session's running turn (committed: its owner reads it at
        its next heartbeat, a broadcast only makes that faster); None when no turn runs.

        Never waits on the lease row's lock: its owner may be paused in the transaction that holds it
        (a renewal, its turn's last write), which PostgreSQL ends after its idle-in-transaction timeout
        (shorter than a lease). Tried again every CANCEL_POLL_SECONDS meanwhile, for at most a lease."""
        deadline = time.monotonic() + self.seconds
        while True:
            try:
                async with self._database.session() as db:
                    flagged = await leases.request_cancel(db, session_id)
                    await db.commit()
                return flagged
            except leases.LeaseBusy as exc:
                if time.monotonic() >= deadline:
                    raise StorageBusy(
                        "The turn's lease stayed locked; retry in a moment.",
                        retry_after=STORAGE_BUSY_RETRY_AFTER,
                    ) from exc
            await asyncio.sleep(CANCEL_POLL_SECONDS)

    async def stopped(self, flagged: leases.LeaseRecord) -> CancelResult:
        """Once the flagged turn's lease is no longer running (or after a lease and two heartbeats, when a
        sweeper should have closed it), what the flag did, from the turn's rows."""
        deadline = time.monotonic() + self.seconds + 2 * self.interval
        while time.monotonic() < deadline:
            async with self._database.session() as db:
                if await leases.state_of(db, flagged.turn_id) != "running":
                    break
            await asyncio.sleep(CANCEL_POLL_SECONDS)
        async with self._database.session() as db:
            rows = await repository.turn_messages(db, flagged.turn_id)
        ends = [row.status for row in rows if row.type == "turn_done"]
        if ends and ends[0] not in ("cancelled", "interrupted"):
            return CancelResult(cancelled=False)  # it ended by itself before its owner read the flag
        cut = [row for row in rows if row.interrupted]
        return CancelResult(
            cancelled=True,
            turn_id=flagged.turn_id,
            interrupted_message_ids=[row.id for row in cut],
            interrupted_tool_call_ids=[row.tool_call_id for row in cut if row.tool_call_id],
        )
