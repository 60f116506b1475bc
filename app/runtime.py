"""The runtime, composed once: `build_runtime(settings, ...)` is the only place that decides the mode.

One process (no PARLEY_REDIS_URL), or one replica of several (PARLEY_REDIS_URL, PostgreSQL). Each of the
three seams gets its local or its replicated implementation here, and nothing is wired after construction:

- Ownership (turns.runtime.ownership), who runs a session's turn: `LocalOwnership`, or `LeasedOwnership`
  (turns.replicas.ownership: leases claimed in a turn's opening transaction, renewed by a heartbeat, fenced
  writes, a sweeper for the turns of a replica that died).
- EventLog (streaming.log.write_behind), which numbers, logs, commits and delivers events: one `WriteBehind`
with its
  group-commit schedule, given at construction where it delivers and, with replicas, the lease fence
  every write of a turn is checked against and the sequencer that numbers from the session's counter row.
- Notifier, what reaches other processes: nothing (turns.runtime.notifier.LocalNotifier; the broker hears
  every event from the write-behind), or the Redis relay (frames to and from the other replicas, and where a
  turn runs) with the control bus and `ReplicaTurns` (requests to the replica whose turn it is).

The result is one async context manager (an AsyncExitStack): entering it builds and starts everything,
leaving it stops everything in this order: the sweeper, the startup repair's retry, the drain (running
turns end, the write-behind flushes), the lease heartbeat, the tools catalog, the write-behind, the relay
and control bus, the stream limits, the model layer, the database, the debug monitor, observability.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from app.api.deps import Services
from app.chat.auth import KeyRing
from app.chat.branches import Branches
from app.chat.files import Files
from app.chat.idempotency import Idempotency
from app.chat.kit_chats import KitChats
from app.chat.limits import MessageLimit, MessageRate, StreamLimit, StreamSlots
from app.chat.messages import Messages
from app.chat.sessions import Sessions
from app.chat.stream_tokens import StreamTokens
from app.chat.tokens import JwksKeys, JwtVerifier
from app.chat.tool_answers import ToolAnswers
from app.chat.turn_view import Turns
from app.llm.gateway import ModelGateway
from app.observability.monitor import DebugStats
from app.observability.setup import start_observability, stop_observability
from app.settings import Settings
from app.storage import event_log, leases
from app.storage.blobs import Blobs, open_blobs
from app.storage.engine import Database, pool_options
from app.streaming.broker import RING_SIZE, Broker, OnGap, OnWatch
from app.streaming.frames import Frame
from app.streaming.log.fencing import Fence
from app.streaming.log.sequencing import CounterSequencer
from app.streaming.log.write_behind import WriteBehind
from app.tools.catalog import ToolCatalog
from app.turns.control import TurnControl
from app.turns.live import LocalLiveStatus
from app.turns.recovery import StartupRepair, close_open_turns
from app.turns.replicas.ownership import LeasedOwnership
from app.turns.replicas.sweeper import Sweeper
from app.turns.runtime.ownership import TurnsHere
from app.turns.runtime.runner import Runner
from app.turns.runtime.shutdown import Drain

if TYPE_CHECKING:
    from app.streaming.redis.relay import RedisRelay

log = logging.getLogger("parley")


@dataclass
class Runtime:
    """What the lifespan hands the routes, and the drain its signal handlers start."""

    services: Services
    drain: Drain
    debug_stats: DebugStats | None
    metrics: Any


async def _nothing() -> None:
    return None


Step = Callable[[], Awaitable[None]]


@dataclass
class _Mode:
    """One mode's turns: its event log, fan-out, runner and turn control; how it starts (once the
    write-behind runs), and its own stops, which the exit stack calls in their places."""

    writer: WriteBehind
    broker: Broker
    runner: Runner
    control: TurnControl
    start: Step
    stop_sweeping: Step = field(default=_nothing)
    stop_repair: Step = field(default=_nothing)
    stop_leases: Step = field(default=_nothing)
    stop_notifier: Step = field(default=_nothing)


@asynccontextmanager
async def build_runtime(settings: Settings, keys: KeyRing, catalog: ToolCatalog) -> AsyncIterator[Runtime]:
    """Builds every component, repairs what a crash left (one process) or joins the replicas, and serves
    until the block ends; then stops them in the order the module's docstring gives."""
    async with AsyncExitStack() as stack:
        exported = start_observability(settings)
        stack.callback(stop_observability)
        database = Database(
            settings.database_url,
            busy_timeout_ms=settings.database_busy_timeout_ms,
            pool=pool_options(settings),
        )
        debug_stats = None
        if settings.debug_stats:
            debug_stats = DebugStats.start(database.engine, stall_ms=settings.debug_stall_ms)
            stack.push_async_callback(debug_stats.stop)
        stack.push_async_callback(database.dispose)
        models = ModelGateway(settings)
        stack.push_async_callback(models.stop)
        # Files' bytes: in the database, or in the object store PARLEY_FILES_URL names.
        blobs = open_blobs(settings.files_url, database, settings.files_chunk_bytes)
        stack.push_async_callback(blobs.close)
        # The one place the mode is decided.
        build = _replicated if settings.multi_replica else _single
        mode = build(settings, database, models, catalog, blobs)
        tokens = _jwt_verifier(settings, keys)
        if tokens is not None:
            stack.push_async_callback(tokens.close)
        services = _services(
            settings, database, mode.control, models, catalog, mode.broker, keys, tokens, blobs
        )
        drain = Drain(mode.runner, mode.writer, mode.broker, timeout=settings.shutdown_timeout)
        # Stopped in the reverse order of these pushes (the module's docstring).
        stack.push_async_callback(services.streams.close)
        stack.push_async_callback(services.sessions.close)  # titles still being written
        stack.push_async_callback(mode.stop_notifier)  # after the write-behind's last flush is published
        stack.push_async_callback(mode.writer.stop)
        stack.push_async_callback(catalog.stop)
        stack.push_async_callback(mode.stop_leases)  # after the drain: its turns released their leases
        stack.push_async_callback(drain.run)
        stack.push_async_callback(mode.stop_repair)
        stack.push_async_callback(mode.stop_sweeping)  # first: no more turns taken over while stopping
        mode.writer.start()
        await mode.start()
        # Last: litellm's import holds the GIL for seconds in its thread, and every step above would share
        # the core with it; now the server starts serving at once, while it loads (/readyz says when).
        models.start()
        catalog.start()
        yield Runtime(services=services, drain=drain, debug_stats=debug_stats, metrics=exported)


def _single(
    settings: Settings, database: Database, models: ModelGateway, catalog: ToolCatalog, blobs: Blobs
) -> _Mode:
    """One process owns every session: what a crash left is repaired before any client can ask (a replica
    repairs only what no live lease holds: `_replicated`)."""
    writer, broker, _ = build_event_log(settings, database)
    live = LocalLiveStatus()
    runner = Runner(settings, database, writer, models, catalog.registry, live, broker, blobs=blobs)
    repair = StartupRepair(database, writer, live, runner)
    return _Mode(writer, broker, runner, runner, start=repair.start, stop_repair=repair.stop)


def _replicated(
    settings: Settings, database: Database, models: ModelGateway, catalog: ToolCatalog, blobs: Blobs
) -> _Mode:
    """One replica of several: turns owned through leases and fenced, the Redis relay as the notifier,
    requests reaching the replica whose turn it is over the control bus (turns.replicas.turns)."""
    # Imported only here: a single server never loads the Redis client (its memory, its import).
    from app.streaming.redis.control_bus import ControlBus
    from app.turns.replicas.turns import ReplicaTurns

    fence = Fence()
    writer, broker, relay = build_event_log(settings, database, fence)
    assert relay is not None
    live = LocalLiveStatus()

    def leased(turns: TurnsHere) -> LeasedOwnership:
        return LeasedOwnership(settings, database, fence, turns)

    runner = Runner(
        settings,
        database,
        writer,
        models,
        catalog.registry,
        live,
        broker,
        ownership=leased,
        notifier=relay,
        blobs=blobs,
    )
    keeper = cast(LeasedOwnership, runner.ownership).keeper
    sweeper = Sweeper(database, writer, live, runner, keeper)
    url, prefix = settings.redis_url or "", settings.redis_prefix
    control = ReplicaTurns(runner, keeper, lambda handle: ControlBus(url, prefix, handle), broker, database)
    bus = control.bus

    async def start() -> None:
        await relay.start()
        await bus.start()
        # A replica never touches a turn some replica holds a lease of: it closes only the turns left open
        # without one (written before multi-replica mode), then sweeps once (expired leases, and sessions
        # whose waiting messages no turn takes) before it serves.
        async with database.session() as db:
            leased_turns = frozenset(await leases.running_turn_ids(db))
        await close_open_turns(database, writer, live, leased=leased_turns)
        await writer.flush()
        keeper.start()
        await sweeper.sweep()
        sweeper.start()
        log.info("replica %s: multi-replica mode, leases of %g s", keeper.replica_id, keeper.seconds)

    async def stop_notifier() -> None:
        await relay.stop()
        await bus.stop()

    return _Mode(
        writer,
        broker,
        runner,
        control,
        start=start,
        stop_sweeping=sweeper.stop,
        stop_leases=keeper.stop,
        stop_notifier=stop_notifier,
    )


def build_event_log(
    settings: Settings, database: Database, fence: Fence | None = None
) -> tuple[WriteBehind, Broker, RedisRelay | None]:
    """The write-behind that numbers, logs and commits events, and the fan-out it delivers them to; with
    PARLEY_REDIS_URL, through the relay that also carries them to and from the other replicas (and makes
    the broker, with its hooks)."""

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

    def make_broker(on_gap: OnGap | None = None, on_watch: OnWatch | None = None) -> Broker:
        return Broker(
            last_seq,
            settings.subscriber_queue_size,
            load_frames=load_frames,
            ring_size=min(RING_SIZE, settings.event_retention),
            on_gap=on_gap,
            on_watch=on_watch,
            keep_seconds=settings.stream_channel_seconds,
        )

    relay = None
    if settings.redis_url is not None:
        from app.streaming.redis.relay import RedisRelay

        relay = RedisRelay(settings.redis_url, settings.redis_prefix, load_frames, load_heads, make_broker)
        broker = relay.broker
    else:
        broker = make_broker()
    broker.start_heartbeat(settings.sse_ping_interval)
    writer = WriteBehind(
        database,
        interval=settings.event_flush_interval,
        text_interval=settings.flush_interval,
        retention=settings.event_retention,
        deliver=relay.deliver if relay is not None else broker.deliver,
        # Several replicas log one session's events: numbers from its counter row, not this process's memory.
        sequencer=CounterSequencer() if settings.multi_replica else None,
        # Multi-replica mode: every write of a turn is checked against its lease (streaming.log.fencing).
        fence=fence,
    )
    return writer, broker, relay


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


def _jwt_verifier(settings: Settings, keys: KeyRing) -> JwtVerifier | None:
    """Bearer JWTs, when configured: with a JWKS URL, its keys are fetched at the first token."""
    if keys.jwt is None:
        return None
    jwks = None
    if keys.jwt.jwks_url is not None:
        jwks = JwksKeys(
            keys.jwt.jwks_url,
            timeout=settings.jwt_jwks_timeout,
            min_refresh=settings.jwt_jwks_refresh_seconds,
            max_age=settings.jwt_jwks_cache_seconds,
        )
    return JwtVerifier(keys.jwt, jwks)


def _services(
    settings: Settings,
    database: Database,
    turns: TurnControl,
    models: ModelGateway,
    catalog: ToolCatalog,
    broker: Broker,
    keys: KeyRing,
    tokens: JwtVerifier | None,
    blobs: Blobs,
) -> Services:
    """The use cases the routes call, and what the routes' dependencies read."""
    # Several replicas: a racing attempt with the same key may run on another one; wait for its answer.
    race_wait = 10.0 if settings.multi_replica else 0.0
    idempotency = Idempotency(
        database, ttl_seconds=settings.idempotency_ttl_hours * 3600, race_wait=race_wait
    )
    stream_tokens = StreamTokens(settings, database)
    sessions = Sessions(
        settings, database, turns, models, catalog.registry, idempotency, stream_tokens, blobs
    )
    files = Files(settings, database, models, blobs)
    messages = Messages(settings, database, sessions, turns, broker, idempotency, files)
    message_rate, streams = _limits(settings)
    answers = ToolAnswers(database, sessions, turns)
    branches = Branches(settings, database, sessions, turns, models, idempotency, files)
    return Services(
        settings=settings,
        sessions=sessions,
        messages=messages,
        turns=Turns(settings, database, sessions, messages, turns),
        answers=answers,
        broker=broker,
        models=models,
        keys=keys,
        tokens=tokens,
        message_rate=message_rate,
        streams=streams,
        tools=catalog,
        branches=branches,
        files=files,
        kits=KitChats(settings, database, sessions, messages, answers, broker, streams, branches),
    )
