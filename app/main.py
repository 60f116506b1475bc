"""The application factory: builds every component in the lifespan and wires the routes."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from app import errors, repository
from app.api import events, health, messages, sessions
from app.api.deps import Services
from app.broker import Broker
from app.db import Database
from app.llm.layer import ModelLayer
from app.recovery import close_open_turns
from app.runner import Runner
from app.service import ChatService
from app.settings import Settings
from app.tools.registry import ToolRegistry, build_default_registry
from app.writer import WriteBehind

log = logging.getLogger("parley")


def create_app(settings: Settings | None = None, *, tools: ToolRegistry | None = None) -> FastAPI:
    """`tools` replaces the built-in registry (tests register slow or failing tools through it)."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[dict[str, Any]]:
        database = Database(settings.database_url)
        models = ModelLayer(settings)
        models.start()
        writer = WriteBehind(database, text_interval=settings.flush_interval)

        async def last_seq(session_id: str) -> int:
            async with database.session() as db:
                return await repository.last_event_seq(db, session_id)

        broker = Broker(last_seq, writer.sink(), settings.subscriber_queue_size)
        registry = tools or build_default_registry()
        runner = Runner(settings, database, broker, writer, models, registry)
        chat = ChatService(settings, database, runner, models, registry, broker, writer)
        writer.start()
        await close_open_turns(database, broker)
        await runner.resume_waiting()
        try:
            yield {"services": Services(settings=settings, chat=chat, broker=broker, models=models)}
        finally:
            await runner.shutdown()
            broker.close_all()
            await writer.stop()
            await models.stop()
            await database.dispose()

    app = FastAPI(
        title="Parley",
        version="0.1.0",
        summary="Agent sessions with queued messages, stop, and one enriched SSE stream per session.",
        lifespan=lifespan,
    )
    errors.install(app)
    app.include_router(health.router)
    app.include_router(sessions.router)
    app.include_router(messages.router)
    app.include_router(events.router)
    return app


app = create_app()
