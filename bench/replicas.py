"""The multi-replica stage (issue 16): what a second replica buys, and what crossing replicas costs.

Replicas are `python -m app` in multi-replica mode (PARLEY_REDIS_URL) on one PostgreSQL database created
for the stage (bench/postgres.py's `run_database`, dropped after it) and the machine's Redis
(PARLEY_BENCH_REDIS_URL, default redis://127.0.0.1:6379/0) under a key prefix of the stage's own, whose
keys are removed after it. Replica A is pinned to the server's core, replica B (started once A's capacity
is known) to the other core, which it shares with the fake upstream and the load client; PostgreSQL and
Redis run unpinned beside them. On a 2-core machine the second replica is therefore not a core of its own:
the figures are what such a machine gives, and the report's note says so.

* Capacity: the most concurrent streaming sessions whose turns keep the duration ratio (POST written →
  `turn_done` read, over the upstream's own duration) at p50 within the limit, with no failed turn; one
  replica, then two, sessions spread round-robin with each session's POST and stream on one replica.
  `capacity` steps the level up while it passes (down while it fails), then halves the gap between the
  best passing level and the lowest failing one, within a budget of levels. The figure is two over one.
* Delivery: each session has a stream on its own replica (where its turns run) and one on the other; the
  same event's read times on both give what crossing replicas adds (Redis publish, the other replica's
  reader, its delivery), event by event.
* Cancel: a stop sent to the replica that does not run the turn, to the upstream seeing its connection
  close (the stop stage's measure, summary.stopping).
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from typing import Any

from bench import summary
from bench.client import EventStream, HttpConn
from bench.context import Context, say
from bench.load import BENCH_MODEL, CancelPlan, Session, Turn, close_sessions, drive
from bench.postgres import run_database
from bench.procs import ServerProcess
from bench.replica_window import RedisCpu, Window
from bench.stats import dist
from bench.streaming import TAIL_S, warm_up
from tests.fakes.directive import bench_content

REDIS_URL = os.environ.get("PARLEY_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
# Two replicas are asked first for the target, 1.8 times one replica's capacity.
TARGET = 1.8
MS = 1000.0


@contextmanager
def deployment(ctx: Context) -> Iterator[dict[str, str]]:
    """The replicas' shared environment: a migrated PostgreSQL database and a Redis key prefix, both the
    stage's own and both cleaned up after it. Fails in one line when either engine does not answer."""
    import redis

    try:
        with redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3) as client:
            client.ping()
    except (redis.RedisError, OSError) as exc:
        raise RuntimeError(f"Redis not reachable at {REDIS_URL} ({exc}); skip with --skip replicas") from exc
    prefix = f"parley-bench-{os.getpid()}-{secrets.token_hex(4)}"
    with run_database(ctx.work / "migrate-replicas.log", stage="replicas") as url:
        try:
            yield {"PARLEY_DATABASE_URL": url, "PARLEY_REDIS_URL": REDIS_URL, "PARLEY_REDIS_PREFIX": prefix}
        finally:
            with redis.Redis.from_url(REDIS_URL) as client:
                keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
                if keys:
                    client.delete(*keys)


def _note(ctx: Context) -> str:
    cores = os.cpu_count() or 1
    if ctx.cores.server is None:
        return f"{cores} core(s) available to the run: nothing pinned, every process shares every core"
    return (
        f"replica A on core {ctx.cores.server}, replica B on core {ctx.cores.other}; on this {cores}-core "
        f"machine B shares its core with the fake upstream and the load client, and PostgreSQL and Redis "
        "run unpinned on both: two replicas do not get two cores of their own here"
    )


async def _open(replicas: list[ServerProcess], count: int, *, arrivals: bool = False) -> list[Session]:
    """`count` sessions, session i on replica i mod n (its POSTs and its stream), 32 opened at a time."""
    gate = asyncio.Semaphore(32)

    async def one(index: int) -> Session:
        async with gate:
            port = replicas[index % len(replicas)].port
            return await Session.create(port, index, BENCH_MODEL, arrivals=arrivals)

    return list(await asyncio.gather(*(one(i) for i in range(count))))


def _content(ctx: Context, prefix: str, chunks: int) -> Callable[[Session, int], tuple[str, str]]:
    def content(session: Session, round_: int) -> tuple[str, str]:
        tag = f"{prefix}-{session.index}-{round_}"
        return tag, bench_content(tag, chunks, ctx.config.delay_ms)

    return content


async def _window(
    ctx: Context, replicas: list[ServerProcess], redis_cpu: RedisCpu, run: Callable[[], Awaitable[list[Turn]]]
) -> tuple[list[Turn], dict[str, Any], dict[str, dict[str, Any]]]:
    """`run` inside one measurement window; the turns, the window and the upstream's records."""
    window = Window(replicas, ctx.upstream, redis_cpu)
    try:
        await window.start()
        turns = await run()
        await asyncio.sleep(0.05 if ctx.config.smoke else TAIL_S)
        measured = await window.stop()
    finally:
        await window.close()
    return turns, measured, ctx.upstream.by_tag()


async def level(
    ctx: Context, replicas: list[ServerProcess], redis_cpu: RedisCpu, sessions: int
) -> dict[str, Any]:
    """One level of a capacity search: `sessions` sessions, `replica_rounds` turns each, back to back."""
    config = ctx.config
    prefix = f"replicas{len(replicas)}-{sessions}"
    opened = await _open(replicas, sessions)
    content = _content(ctx, prefix, config.chunks)
    try:
        turns, window, upstream = await _window(
            ctx,
            replicas,
            redis_cpu,
            lambda: drive(opened, config.replica_rounds, config.ramp_s, content, config.turn_timeout()),
        )
    finally:
        await close_sessions(opened)
    ctx.dump(f"turns-{prefix}", [t.as_dict() for t in turns])
    ctx.dump(f"upstream-{prefix}", [{"tag": tag, **record} for tag, record in upstream.items()])
    found = summary.streaming(turns, upstream, window, 0.0)
    for meaningless in ("cpu_per_chunk_net_us", "idle_cpu_rate"):  # no idle rate is measured here
        found.pop(meaningless)
    ratio = found["duration_ratio"]
    passed = (
        found["errors"]["count"] == 0
        and ratio["p50"] is not None
        and ratio["p50"] <= config.replica_ratio_limit
    )
    utils = ", ".join(f"{r['util']:.0%}" for r in window["replicas"])
    busy = ", ".join(f"{share:.0%}" for share in window["core_busy_share"].values())
    say(
        f"  {len(replicas)} replica(s), {sessions} sessions: ratio p50 {ratio['p50']} p99 {ratio['p99']}, "
        f"errors {found['errors']['count']}, replicas at {utils} of a core, PostgreSQL at "
        f"{window['postgres_util']:.0%}, cores busy {busy}: "
        f"{'within' if passed else 'over'} {config.replica_ratio_limit}"
    )
    return {"concurrency": sessions, "replicas": len(replicas), "passed": passed, **found}


Measure = Callable[[int], Awaitable[dict[str, Any]]]


def bounds(tried: dict[int, dict[str, Any]]) -> tuple[int | None, int | None]:
    """The best passing level below every failing one, and the lowest failing level (None: none)."""
    failing = min((n for n, run in tried.items() if not run["passed"]), default=None)
    passing = [n for n, run in tried.items() if run["passed"] and (failing is None or n < failing)]
    return max(passing, default=None), failing


async def capacity(measure: Measure, start: int, step: int, budget: int) -> dict[str, Any]:
    """From `start`: up by `step` while levels pass, or halving while they fail (a failing first guess
    says nothing of how far off it was), until the outcome changes; then halves the gap between the best
    pass and the lowest failure until it is within a tenth of the pass; at most `budget` levels in all.
    `bounded` is False when no level failed: the capacity is then a floor, not the measured limit."""
    tried: dict[int, dict[str, Any]] = {}

    async def passes(sessions: int) -> bool:
        if sessions not in tried:
            tried[sessions] = await measure(sessions)
        return bool(tried[sessions]["passed"])

    current = max(1, start)
    first = await passes(current)
    while len(tried) < budget:
        following = current + step if first else max(1, current // 2)
        if following == current or await passes(following) != first:
            break
        current = following
    while len(tried) < budget:
        low, high = bounds(tried)
        if low is None or high is None or high - low <= max(1, low // 10):
            break
        await passes((low + high) // 2)
    low, high = bounds(tried)
    return {"capacity": low or 0, "bounded": high is not None, "levels": [tried[n] for n in sorted(tried)]}


async def delivery(ctx: Context, replicas: list[ServerProcess], redis_cpu: RedisCpu) -> dict[str, Any]:
    """Streams on both replicas for every session, turns on the session's own: per event, the read time on
    the other replica minus the read time on the turn's."""
    config = ctx.config
    count = config.replica_delivery_sessions
    say(f"replicas: delivery across replicas, {count} sessions x {config.replica_rounds} turns")
    sessions = await _open(replicas, count, arrivals=True)
    others: list[EventStream] = []
    content = _content(ctx, "replicas-delivery", config.chunks)

    async def run() -> list[Turn]:
        turns = await drive(sessions, config.replica_rounds, config.ramp_s, content, config.turn_timeout())
        for session, other in zip(sessions, others, strict=True):
            with suppress(TimeoutError, RuntimeError):  # what never arrived is counted as missing below
                await other.wait_id(session.stream.last_id, 30.0)
        return turns

    try:
        for session in sessions:
            other = replicas[(session.index + 1) % len(replicas)]
            others.append(await EventStream(other.port, session.id, arrivals=True).open())
        turns, window, _ = await _window(ctx, replicas, redis_cpu, run)
    finally:
        await asyncio.gather(*(other.close() for other in others), return_exceptions=True)
        await close_sessions(sessions)
    failed = [turn.error for turn in turns if turn.error is not None]
    return {
        "sessions": count,
        "rounds": config.replica_rounds,
        **_compare(sessions, others),
        "turns": len(turns),
        "errors": {"count": len(failed), "first": failed[0] if failed else None},
        "window": window,
    }


def _compare(sessions: list[Session], others: list[EventStream]) -> dict[str, Any]:
    added: dict[str, list[float]] = {}
    missing = 0
    for session, other in zip(sessions, others, strict=True):
        own, there = session.stream.arrivals or {}, other.arrivals or {}
        direction = f"{'AB'[session.index % 2]} to {'BA'[session.index % 2]}"
        for seq, at in own.items():
            if seq in there:
                added.setdefault(direction, []).append(there[seq] - at)
            else:
                missing += 1
    every = [value for values in added.values() for value in values]
    return {
        "added_ms": dist(every, MS),
        "added_ms_by_direction": {direction: dist(values, MS) for direction, values in sorted(added.items())},
        "events": len(every),
        "missing": missing,
    }


def _stop_pairs(after_s: float, jitter_s: float, seed: int = 16) -> CancelPlan:
    """Stops sessions 0 and 1, 4 and 5, ... (one on each replica, round-robin) `after_s` plus up to
    `jitter_s` after their first text; the others stream on undisturbed."""
    import random

    rng = random.Random(seed)
    plan: dict[tuple[int, int], float] = {}

    def cancel(session: int, round_: int) -> float | None:
        if (session // 2) % 2:
            return None
        return plan.setdefault((session, round_), after_s + rng.random() * jitter_s)

    return cancel


async def cancel(ctx: Context, replicas: list[ServerProcess], redis_cpu: RedisCpu) -> dict[str, Any]:
    """The stop stage's load, each stop sent to the replica that does not run the turn."""
    config = ctx.config
    count, chunks = config.replica_cancel_sessions, config.replica_cancel_chunks
    say(f"replicas: stops on the other replica, {count} sessions x {config.stop_rounds} rounds, half stopped")
    sessions = await _open(replicas, count)
    for session in sessions:
        session.cancel_conn = HttpConn(replicas[(session.index + 1) % len(replicas)].port)
    plan = _stop_pairs(config.stop_after_s, min(1.0, 0.25 * config.stream_seconds(chunks)))
    content = _content(ctx, "replicas-cancel", chunks)
    timeout = config.turn_timeout(chunks)
    try:
        turns, window, upstream = await _window(
            ctx,
            replicas,
            redis_cpu,
            lambda: drive(sessions, config.stop_rounds, config.ramp_s, content, timeout, plan),
        )
    finally:
        await close_sessions(sessions)
    ctx.dump("turns-replicas-cancel", [t.as_dict() for t in turns])
    return {"sessions": count, "rounds": config.stop_rounds, **summary.stopping(turns, upstream, window)}


async def replicas(ctx: Context) -> dict[str, Any]:
    config = ctx.config
    found: dict[str, Any] = {"note": _note(ctx), "ratio_limit": config.replica_ratio_limit}
    with deployment(ctx) as env, ExitStack() as stack, RedisCpu(REDIS_URL) as redis_cpu:
        a = stack.enter_context(ctx.server("replica-a", extra=env))
        await warm_up(a)
        start, step = config.replica_start, config.replica_step
        say(f"replicas: capacity of one replica, from {start} sessions by {step}")
        one = await capacity(lambda n: level(ctx, [a], redis_cpu, n), start, step, config.replica_searches)
        found["one"] = one
        b = stack.enter_context(ctx.server("replica-b", extra=env, core=ctx.cores.other))
        await warm_up(b)
        # Two replicas are asked the target first: whether they pass it is the first answer.
        start = max(2, round(TARGET * one["capacity"])) if one["capacity"] else 2 * start
        say(f"replicas: capacity of two replicas, from {start} sessions by {2 * step}")
        found["two"] = await capacity(
            lambda n: level(ctx, [a, b], redis_cpu, n), start, 2 * step, config.replica_searches
        )
        found["delivery"] = await delivery(ctx, [a, b], redis_cpu)
        found["cancel"] = await cancel(ctx, [a, b], redis_cpu)
    say(f"replicas: {_summary_line(found)}")
    return found


def _summary_line(found: dict[str, Any]) -> str:
    one, two = found["one"]["capacity"], found["two"]["capacity"]
    return (
        f"capacity {one} sessions on one replica, {two} on two; delivery across replicas adds "
        f"{found['delivery']['added_ms']['p99']} ms p99; cancel to disconnect p99 "
        f"{found['cancel']['cancel_to_disconnect_ms']['p99']} ms"
    )
