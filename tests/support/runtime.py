"""The turn runtime of one process, built as the lifespan (app/main.py) builds it, on a real migrated SQLite
file, for tests that drive the runner, the drain or the turn view without a server.

Its model layer is never started: resolving a model waits for litellm to load (ModelGateway.ready), so
every turn stays in its preparation until it is stopped. That is a running turn that ends only when a test
ends it: nothing is mocked, and litellm is not loaded.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from app.llm.gateway import ModelGateway
from app.protocol.schemas import MessageAccepted
from app.settings import DEMO_MODEL, Settings
from app.storage import event_log, repository
from app.storage.blobs import DatabaseBlobs
from app.storage.engine import Database
from app.storage.tables import ChatSessionRow
from app.streaming.broker import Broker
from app.streaming.frames import Frame
from app.streaming.log.write_behind import WriteBehind
from app.tools.registry import ToolRegistry, build_default_registry
from app.turns.live import LocalLiveStatus
from app.turns.runtime.runner import Runner

T0 = "2026-02-28T06:30:00.000+00:00"


@dataclass
class Runtime:
    settings: Settings
    database: Database
    writer: WriteBehind
    broker: Broker
    models: ModelGateway
    tools: ToolRegistry
    live: LocalLiveStatus
    runner: Runner

    async def add_session(self, session_id: str, principal: str = "") -> ChatSessionRow:
        row = ChatSessionRow(
            id=session_id, principal=principal, model=DEMO_MODEL, tools=[], created_at=T0, updated_at=T0
        )
        async with self.database.session() as db:
            db.add(row)
            await db.commit()
        return row

    async def start_turn(self, session: ChatSessionRow, content: str = "hi") -> str:
        """Posts to the idle session: its turn starts, and runs until it is stopped. Returns once the turn's
        task has begun (a stop before that is noted and acted on when it begins: tests/turns/test_runner)."""
        answer: MessageAccepted = await self.runner.post(session, content, "User", "steer")
        assert answer.turn_id is not None
        await asyncio.sleep(0)
        return answer.turn_id

    async def history(self, session_id: str) -> list[tuple[str, str | None]]:
        """The session's rows as (type, status)."""
        async with self.database.session() as db:
            return [(r.type, r.status) for r in await repository.list_messages(db, session_id)]


@asynccontextmanager
async def runtime(settings: Settings) -> AsyncIterator[Runtime]:
    database = Database(settings.database_url, busy_timeout_ms=settings.database_busy_timeout_ms)

    async def last_seq(session_id: str) -> int:
        async with database.session() as db:
            return await event_log.last_event_seq(db, session_id)

    async def load_frames(session_id: str, after: int, before: int) -> list[Frame]:
        async with database.session() as db:
            rows = await event_log.events_between(db, session_id, after, before)
        return [Frame(seq, type_, data, turn) for seq, type_, data, turn in rows]

    broker = Broker(last_seq, settings.subscriber_queue_size, load_frames=load_frames)
    writer = WriteBehind(database, deliver=broker.deliver)
    models, tools, live = ModelGateway(settings), build_default_registry(), LocalLiveStatus()
    blobs = DatabaseBlobs(database, settings.files_chunk_bytes)
    runner = Runner(settings, database, writer, models, tools, live, broker, blobs=blobs)
    try:
        yield Runtime(settings, database, writer, broker, models, tools, live, runner)
    finally:
        await runner.shutdown()
        await writer.stop()
        broker.close_all()
        await models.stop()
        await database.dispose()
