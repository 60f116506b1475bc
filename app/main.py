"""The application factory: builds every component in the lifespan and wires the routes."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware

from app import errors
from app.api import debug, events, health, messages, metrics, sessions, tool_requests, turns, ui
from app.api.deps import Services, known_query_only
from app.api.middleware import RequestContextMiddleware
from app.api.tools import router as tools_router
from app.chat.auth import KeyRing, load_key_ring
from app.chat.idempotency import Idempotency
from app.chat.limits import MessageLimit, MessageRate, StreamLimit, StreamSlots
from app.chat.messages import Messages
from app.chat.sessions import Sessions
from app.chat.tool_answers import ToolAnswers
from app.chat.turn_view import Turns
from app.llm.gateway import ModelGateway
from app.observability.access_log import install_access_log_redaction
from app.observability.context import SessionIdMiddleware, install_request_id_logging
from app.observability.monitor import DebugStats
from app.observability.redaction import redact_provider_logs
from app.observability.setup import install_tracing, start_observability, stop_observability
from app.protocol.openapi import install_openapi
from app.settings import Settings
from app.storage import event_log
from app.storage.engine import Database, pool_options
from app.streaming.broker import RING_SIZE, Broker
from app.streaming.fencing import Fence
from app.streaming.frames import Frame
from app.streaming.sequencing import CounterSequencer
from app.streaming.writer import WriteBehind
from app.tools.catalog import ToolCatalog
from app.tools.registry import ToolRegistry, build_default_registry
from app.turns.control import TurnControl
from app.turns.live import LocalLiveStatus
from app.turns.recovery import StartupRepair
from app.turns.replica_mode import Replicas
from app.turns.runner import Runner
from app.turns.shutdown import Drain, drain_on_signals

if TYPE_CHECKING:
    from app.streaming.control import ControlBus
    from app.streaming.redis_fanout import RedisRelay

log = logging.getLogger("parley")
install_request_id_logging()
install_access_log_redaction()
redact_provider_logs()

# What a browser on an allowed origin may send and read (CORS is off unless PARLEY_CORS_ORIGINS is set).
CORS_REQUEST_HEADERS = ["Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID", "X-Request-ID"]
CORS_RESPONSE_HEADERS = ["X-Request-ID", "Idempotent-Replayed", "Retry-After"]


def create_app(settings: Settings | None = None, *, tools: ToolRegistry | None = None) -> FastAPI:
    """`tools` replaces the built-in registry (tests register slow or failing tools through it)."""
    settings = settings or Settings()
    problem = settings.replica_problem()
    if problem is not None:
        # One line and a non-zero exit, also under `python -m uvicorn app.main:app` (no launcher).
        raise SystemExit(f"parley: {problem}")
    # Here rather than in the lifespan: a keys file that cannot be used stops the server before it serves.
    keys = load_key_ring(settings)
    # So is a tools file with a bad entry (ToolsConfigError).
    catalog = ToolCatalog.load(
        tools or build_default_registry(),
        settings.tools_file,
        retry_max=settings.mcp_retry_max,
        connect_timeout=settings.mcp_connect_timeout,
    )

    app = FastAPI(
        title="Parley",
        version="0.1.0",
        summary="Agent sessions with queued messages, stop, and one enriched SSE stream per session.",
        lifespan=_lifespan(settings, keys, catalog),
        dependencies=[Depends(known_query_only)],
        docs_url=None,  # served by app.api.ui with local assets instead of FastAPI's CDN ones
        redoc_url=None,
    )
    errors.install(app)
    app.include_router(health.router)
    app.include_router(sessions.router)
    app.include_router(messages.router)
    app.include_router(events.router)
    app.include_router(turns.router)
    app.include_router(tools_router)
    app.include_router(tool_requests.router)
    app.include_router(ui.docs_router)
    if settings.ui:
        app.include_router(ui.router)
    if settings.debug_stats:
        app.include_router(debug.router)
    if settings.metrics:
        app.include_router(metrics.router)
    app.add_middleware(SessionIdMiddleware)
    app.add_middleware(
        RequestContextMiddleware,
        max_body_bytes=settings.max_body_bytes,
        max_header_bytes=settings.max_header_bytes,
        loopback_only=keys.is_open and not settings.allow_open,
    )
    if settings.cors_origins:
        # Outermost, so that the middleware's own refusals (413, 415) carry the CORS headers too.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "PATCH", "DELETE"],
            allow_headers=CORS_REQUEST_HEADERS,
            expose_headers=CORS_RESPONSE_HEADERS,
            max_age=600,
        )
    install_openapi(app)
    # Last: its middleware is then the outermost, so a request's span covers everything, CORS included.
    install_tracing(app)
    return app


def _lifespan(
    settings: Settings, keys: KeyRing, catalog: ToolCatalog
) -> Callable[[FastAPI], AbstractAsyncContextManager[dict[str, Any]]]:
    """Builds every component at startup, repairs what a crash left, and drains at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        exported = start_observability(settings)
        database = Database(
            settings.database_url,
            busy_timeout_ms=settings.database_busy_timeout_ms,
            pool=pool_options(settings),
        )
        debug_stats = None
        if settings.debug_stats:
            debug_stats = DebugStats.start(database.engine, stall_ms=settings.debug_stall_ms)
        models = ModelGateway(settings)
        # Multi-replica mode: every write of a turn is checked against its lease (streaming.fencing).
        fence = Fence() if settings.multi_replica else None
        writer, broker, relay = _event_log(settings, database, fence)
        live = LocalLiveStatus()
        parts = (settings, database, writer, models, catalog.registry, live, broker)
        replicas = None
        if fence is not None and relay is not None:
            replicas = Replicas(*parts, fence=fence, notifier=relay)
        runner = replicas.runner if replicas is not None else Runner(*parts)
        turns, bus = _turn_control(settings, replicas, broker, database)
        turns = turns or runner
        services = _services(settings, database, turns, models, catalog, broker, keys)
        drain = app.state.drain = Drain(runner, writer, broker, timeout=settings.shutdown_timeout)
        writer.start()
        if relay is not None and bus is not None:
            await relay.start()
            await bus.start()
        repair = None
        if replicas is not None:
            await replicas.start()
        else:
            # One process owns every session: what a crash left is repaired before any client can ask
            # (a replica repairs only what no live lease holds: turns.replica_mode).
            repair = StartupRepair(database, writer, live, runner)
            await repair.start()
        # Last: litellm's import holds the GIL for seconds in its thread, and every step above would share
        # the core with it; now the server starts serving at once, while it loads (/readyz says when).
        models.start()
        catalog.start()
        try:
            with drain_on_signals(drain):
                yield {"services": services, "debug_stats": debug_stats, "metrics": exported}
        finally:
            if replicas is not None:
                await replicas.stop_sweeping()
            if repair is not None:
                await repair.stop()
            await drain.run()
            if replicas is not None:
                await replicas.stop()
            await catalog.stop()
            await writer.stop()
            await _stop_shared(relay, bus, services)
            await models.stop()
            await database.dispose()
            if debug_stats is not None:
                await debug_stats.stop()
            stop_observability()

    return lifespan


async def _stop_shared(relay: RedisRelay | None, bus: ControlBus | None, services: Services) -> None:
    """After the write-behind's last flush (its frames are published too) and every stream's end."""
    if relay is not None and bus is not None:
        await relay.stop()
        await bus.stop()
    await services.streams.close()


def _limits(settings: Settings) -> tuple[MessageLimit, StreamLimit]:
    """Counted in this process, or with PARLEY_REDIS_URL across every replica (chat.redis_limits)."""
    if settings.redis_url is None:
        return MessageRate(settings.messages_per_minute), StreamSlots(settings.max_streams_per_principal)
    from app.chat.redis_limits import redis_limits

    return redis_limits(
        settings.redis_url,
        settings.redis_prefix,
        settings.messages_per_minute,
        settings.max_streams_per_principal,
        # A slot lives as long as a turn's lease: a dead replica's streams stop counting as its turns end.
        lifetime=settings.lease_seconds,
        renew_every=settings.heartbeat_seconds,
    )


def _event_log(
    settings: Settings, database: Database, fence: Fence | None = None
) -> tuple[WriteBehind, Broker, RedisRelay | None]:
    """The write-behind that numbers, logs and commits events, and the fan-out it delivers them to; with
    PARLEY_REDIS_URL, through the relay that also carries them to and from the other replicas."""

    async def last_seq(session_id: str) -> int:
        async with database.read() as db:
            return await event_log.last_event_seq(db, session_id)

    async def load_frames(session_id: str, after: int, before: int) -> list[Frame]:
        async with database.read() as db:
            rows = await event_log.events_between(db, session_id, after, before)
        return [Frame(seq, type_, data, turn) for seq, type_, data, turn in rows]

    async def load_heads(session_ids: list[str]) -> dict[str, int]:
        async with database.read() as db:
            return await event_log.last_event_seqs(db, session_ids)

    relay = None
    if settings.redis_url is not None:
        from app.streaming.redis_fanout import RedisRelay

        relay = RedisRelay(settings.redis_url, settings.redis_prefix, load_frames, load_heads)
    broker = Broker(
        last_seq,
        settings.subscriber_queue_size,
        load_frames=load_frames,
        ring_size=min(RING_SIZE, settings.event_retention),
        on_gap=relay.gap if relay is not None else None,
        on_watch=relay.watch if relay is not None else None,
    )
    if relay is not None:
        relay.attach(broker)
    writer = WriteBehind(
        database,
        interval=settings.event_flush_interval,
        text_interval=settings.flush_interval,
        retention=settings.event_retention,
        deliver=relay.deliver if relay is not None else broker.deliver,
        # Several replicas log one session's events: numbers from its counter row, not this process's memory.
        sequencer=CounterSequencer() if settings.multi_replica else None,
        fence=fence,
    )
    broker.keep_seconds = settings.stream_channel_seconds
    broker.start_heartbeat(settings.sse_ping_interval)
    return writer, broker, relay


def _turn_control(
    settings: Settings, replicas: Replicas | None, broker: Broker, database: Database
) -> tuple[TurnControl | None, ControlBus | None]:
    """With PARLEY_REDIS_URL, the replica's runner reached across replicas (turns.replicas); else
    nothing: the runner alone is the turns' control."""
    if settings.redis_url is None or replicas is None:
        return None, None
    # Imported only here: a single server never loads the Redis client (its memory, its import).
    from app.streaming.control import ControlBus
    from app.turns.replicas import ReplicaTurns

    bus = ControlBus(settings.redis_url, settings.redis_prefix)
    return ReplicaTurns(replicas.runner, replicas.keeper, bus, broker, database), bus


def _services(
    settings: Settings,
    database: Database,
    turns: TurnControl,
    models: ModelGateway,
    catalog: ToolCatalog,
    broker: Broker,
    keys: KeyRing,
) -> Services:
    """The use cases the routes call, and what the routes' dependencies read."""
    # Several replicas: a racing attempt with the same key may run on another one; wait for its answer.
    race_wait = 10.0 if settings.multi_replica else 0.0
    idempotency = Idempotency(
        database, ttl_seconds=settings.idempotency_ttl_hours * 3600, race_wait=race_wait
    )
    sessions = Sessions(settings, database, turns, models, catalog.registry, idempotency)
    messages = Messages(settings, database, sessions, turns, broker, idempotency)
    message_rate, streams = _limits(settings)
    return Services(
        settings=settings,
        sessions=sessions,
        messages=messages,
        turns=Turns(settings, database, sessions, messages, turns),
        answers=ToolAnswers(database, sessions, turns),
        broker=broker,
        models=models,
        keys=keys,
        message_rate=message_rate,
        streams=streams,
        tools=catalog,
    )


app = create_app()
