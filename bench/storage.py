"""Storage and idle streams, on one server started over a seeded database (see seed.py).

- History pages: GET .../messages?limit=100 of the seeded long session, timed at the client (request
  written -> body read) over repeated calls: the first page, a middle page (`after` = the id of the
  middle message) and the newest page (`before` = the last message), the one a chat UI opens with.
- Replay: GET .../events?after=0 on the seeded replay session -> the chunk holding its last event read,
  repeated; each replay reads the log (live delivery only fills the broker's ring, a replay never does).
- Idle streams: N event streams opened on N idle sessions; the server's RSS before and after.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.client import EventStream, HttpConn
from bench.context import Context, say
from bench.procs import ServerProcess
from bench.seed import Seeded, seed
from bench.stats import dist

MS = 1000.0


async def _timed_get(conn: HttpConn, path: str) -> float:
    began = time.monotonic()
    status, body = await conn.request("GET", path)
    elapsed = time.monotonic() - began
    if status != 200:
        raise RuntimeError(f"GET {path}: HTTP {status}: {body[:200]!r}")
    return elapsed


async def pages(server: ServerProcess, seeded: Seeded, page: int, calls: int) -> dict[str, Any]:
    base = f"/v1/sessions/{seeded.history_session}/messages?limit={page}"
    ids = seeded.history_ids
    paths = {
        "first": base,
        "middle": f"{base}&after={ids[len(ids) // 2]}",
        "newest": f"{base}&before={ids[-1]}",
    }
    conn = HttpConn(server.port)
    try:
        for path in paths.values():  # warm: the first call pays for code paths, not for the data
            await _timed_get(conn, path)
        samples: dict[str, list[float]] = {name: [] for name in paths}
        cpu = server.cpu_seconds()
        for _ in range(calls):
            for name, path in paths.items():
                samples[name].append(await _timed_get(conn, path))
        cpu = server.cpu_seconds() - cpu
    finally:
        await conn.close()
    result: dict[str, Any] = {name: dist(values, MS) for name, values in samples.items()}
    # The server's own CPU per page: what a busy machine does not change, unlike the times above.
    result["server_cpu_ms_per_page"] = round(cpu * MS / (calls * len(paths)), 3)
    result["all"] = dist([v for values in samples.values() for v in values], MS)
    result["messages_in_session"] = seeded.history_messages
    result["page_size"] = page
    return result


async def replay(server: ServerProcess, seeded: Seeded, runs: int) -> dict[str, Any]:
    times: list[float] = []
    resyncs = 0
    cpu = server.cpu_seconds()
    for _ in range(runs):
        stream = EventStream(server.port, seeded.replay_session, after=0)
        began = time.monotonic()
        try:
            await stream.open()
            reached = await stream.wait_id(seeded.replay_events, timeout=120)
            times.append(reached - began)
            resyncs += stream.counts["resync"]
        finally:
            await stream.close()
    cpu = server.cpu_seconds() - cpu
    return {
        "events": seeded.replay_events,
        "runs": runs,
        "resyncs": resyncs,
        "ms": dist(times, MS),
        "server_cpu_ms_per_replay": round(cpu * MS / runs, 1),
    }


async def idle_streams(server: ServerProcess, seeded: Seeded, settle_s: float) -> dict[str, Any]:
    sessions = seeded.idle_sessions
    # A few streams opened and closed first: the per-stream figure must not carry first-use costs.
    warm = [await EventStream(server.port, s).open() for s in sessions[:10]]
    await asyncio.gather(*(s.close() for s in warm))
    await asyncio.sleep(settle_s)
    before = server.memory()["rss_mb"]
    gate = asyncio.Semaphore(100)

    async def open_one(session_id: str) -> EventStream:
        async with gate:
            return await EventStream(server.port, session_id).open()

    began = time.monotonic()
    open_cpu = server.cpu_seconds()
    streams = await asyncio.gather(*(open_one(s) for s in sessions), return_exceptions=True)
    opened = [s for s in streams if isinstance(s, EventStream)]
    open_s = time.monotonic() - began
    open_cpu = server.cpu_seconds() - open_cpu
    failed = [repr(s)[:200] for s in streams if not isinstance(s, EventStream)]
    try:
        await asyncio.sleep(settle_s)
        cpu = server.cpu_seconds()
        await asyncio.sleep(settle_s)
        cpu_rate = (server.cpu_seconds() - cpu) / settle_s
        after = server.memory()["rss_mb"]
    finally:
        await asyncio.gather(*(s.close() for s in opened))
    await asyncio.sleep(settle_s)
    closed = server.memory()["rss_mb"]
    delta = after - before
    return {
        "streams": len(opened),
        "failed": len(failed),
        "first_failure": failed[0] if failed else None,
        "open_seconds": round(open_s, 3),
        # Server CPU per stream opened (100 at a time): subscribe, replay check, response start.
        "open_cpu_ms_per_stream": round(open_cpu * 1000 / len(opened), 2) if opened else None,
        "rss_before_mb": round(before, 1),
        "rss_open_mb": round(after, 1),
        "rss_after_close_mb": round(closed, 1),
        "rss_delta_mb": round(delta, 1),
        "per_stream_kb": round(delta * 1024 / len(opened), 1) if opened else None,
        "idle_cpu_rate_open": round(cpu_rate, 4),
    }


async def storage(
    ctx: Context, *, with_idle_streams: bool, database_url: str | None = None
) -> dict[str, Any]:
    """On a fresh SQLite copy, or on `database_url` (an empty migrated PostgreSQL database)."""
    config = ctx.config
    db = ctx.fresh_db("storage")
    idle = config.idle_streams if with_idle_streams else 0
    say(f"storage: seeding {config.messages} messages, {config.events} events, {idle} idle sessions")
    began = time.monotonic()
    seeded = await seed(database_url or db, messages=config.messages, events=config.events, idle=idle)
    seeded_s = time.monotonic() - began
    # Retention above the seeded log, so that after=0 replays it rather than answering a resync.
    retention = str(max(10_000, 2 * seeded.replay_events))
    result: dict[str, Any] = {"seed": {"method": "direct (bench/seed.py)", "seconds": round(seeded_s, 2)}}
    extra = {"PARLEY_EVENT_RETENTION": retention}
    if database_url is not None:
        extra["PARLEY_DATABASE_URL"] = database_url
    label = "storage" if database_url is None else "storage-postgres"
    with ctx.server(label, db=db, extra=extra) as server:
        result["pages_ms"] = await pages(server, seeded, config.page_size, config.page_calls)
        say(f"  GET messages?limit={config.page_size} p99 {result['pages_ms']['all']['p99']} ms")
        result["replay"] = await replay(server, seeded, config.replays)
        say(f"  replay of {seeded.replay_events} events: p50 {result['replay']['ms']['p50']} ms")
        if with_idle_streams:
            say(f"idle streams: opening {len(seeded.idle_sessions)}")
            result["idle_streams"] = await idle_streams(server, seeded, config.idle_s)
            say(f"  +{result['idle_streams']['rss_delta_mb']} MB for {result['idle_streams']['streams']}")
    return result
