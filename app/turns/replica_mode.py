"""Multi-replica mode's runtime, built in the lifespan: the fence the write-behind checks, the lease keeper
(claims, heartbeat, cancel flags), the leased runner and the sweeper, and what a replica does at start.

At start a replica never touches a turn some replica holds a lease of: it closes only the turns left
open without one (written before multi-replica mode), then sweeps once (expired leases, and sessions
whose waiting messages no turn takes) before it serves.
"""

from __future__ import annotations

import logging
from typing import cast

from app.llm.gateway import ModelGateway
from app.settings import Settings
from app.storage import leases
from app.storage.engine import Database
from app.streaming.broker import EventFanOut
from app.streaming.fencing import Fence
from app.streaming.writer import WriteBehind
from app.tools.registry import ToolRegistry
from app.turns.lease import LeaseKeeper
from app.turns.live import LiveStatusBoard
from app.turns.notifier import Notifier
from app.turns.ownership import LeasedOwnership, TurnsHere
from app.turns.recovery import close_open_turns
from app.turns.runner import Runner
from app.turns.sweeper import Sweeper

log = logging.getLogger(__name__)


class Replicas:
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
        fence: Fence,
        notifier: Notifier,
    ) -> None:
        self._database = database
        self._writer = writer
        self._live = live
        self.fence = fence

        def leased(turns: TurnsHere) -> LeasedOwnership:
            return LeasedOwnership(settings, database, fence, turns)

        self.runner = Runner(
            settings, database, writer, models, tools, live, fanout, ownership=leased, notifier=notifier
        )
        self.keeper: LeaseKeeper = cast(LeasedOwnership, self.runner.ownership).keeper
        self.sweeper = Sweeper(database, writer, live, self.runner, self.keeper)

    async def start(self) -> None:
        async with self._database.session() as db:
            leased = frozenset(await leases.running_turn_ids(db))
        await close_open_turns(self._database, self._writer, self._live, leased=leased)
        await self._writer.flush()
        self.keeper.start()
        await self.sweeper.sweep()
        self.sweeper.start()
        log.info(
            "replica %s: multi-replica mode, leases of %g s", self.keeper.replica_id, self.keeper.seconds
        )

    async def stop_sweeping(self) -> None:
        """First at shutdown: this replica takes no more turns over while it stops its own."""
        await self.sweeper.stop()

    async def stop(self) -> None:
        """After the drain: its turns have ended and released their leases."""
        await self.keeper.stop()
