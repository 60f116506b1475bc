"""What a server keeps of the sessions it served, once they rested: memory that must not grow with them.

A server that kept something for every session it ever served (a state, a stream channel with its ring
of recent events) grows for as long as it runs. Here one server (the demo model, SQLite) serves two waves
of `retained_sessions` sessions; each opens its stream, runs one turn, and closes the stream. Both keep
windows are 1 s (PARLEY_IDLE_SESSION_SECONDS, PARLEY_STREAM_CHANNEL_SECONDS, with a heartbeat every
0.5 s), and the RSS is read once each wave has rested past them. The first wave grows the allocator's
arenas, which it keeps; the second reuses them, so its growth over the first is what the server holds
per session served.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench.context import Context, say
from bench.load import Session
from bench.streaming import DEMO_MODEL

SETTLE_S = 3.0  # past both 1 s windows and a few heartbeats
PARALLEL = 50


async def _wave(port: int, count: int, timeout: float) -> int:
    """`count` sessions, `PARALLEL` at a time: stream, one turn, close. Returns the turns that failed."""
    gate = asyncio.Semaphore(PARALLEL)

    async def one(index: int) -> bool:
        async with gate:
            session = await Session.create(port, index, DEMO_MODEL)
            try:
                turn = await session.turn(f"retained-{index}", 0, "Tell me a story.", timeout, None)
            finally:
                await session.close()
            return turn.error is None and turn.status == "completed"

    done = await asyncio.gather(*(one(i) for i in range(count)))
    return sum(1 for ok in done if not ok)


async def retained(ctx: Context) -> dict[str, Any]:
    count = ctx.config.retained_sessions
    extra = {
        "PARLEY_IDLE_SESSION_SECONDS": "1",
        "PARLEY_STREAM_CHANNEL_SECONDS": "1",
        "PARLEY_SSE_PING_INTERVAL": "0.5",
        "PARLEY_DEMO_TOKEN_DELAY": "0.001",
    }
    say(f"retained: two waves of {count} sessions (stream, one demo turn, close)")
    with ctx.server("retained", db=ctx.fresh_db("retained"), extra=extra) as server:
        first_failed = await _wave(server.port, count, 60.0)
        await asyncio.sleep(SETTLE_S)
        before = server.memory()["rss_mb"]
        second_failed = await _wave(server.port, count, 60.0)
        await asyncio.sleep(SETTLE_S)
        after = server.memory()["rss_mb"]
    per_session = round((after - before) * 1024 / count, 2)
    say(f"  RSS after the first wave {before:.1f} MB, the second {after:.1f} MB: {per_session} KB a session")
    return {
        "sessions": count,
        "failed_turns": first_failed + second_failed,
        "rss_after_first_mb": round(before, 1),
        "rss_after_second_mb": round(after, 1),
        "per_session_kb": per_session,
    }
