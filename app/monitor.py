"""Debug statistics for benchmarks: event-loop lag and database commits, off unless PARLEY_DEBUG_STATS=1.

- `LoopLag`: a ticker task that sleeps `interval` and records how late it woke (a bounded buffer), so a
  stall of the event loop (a synchronous tail, a slow serialization) shows up as lag.
- `CommitCounter`: a SQLAlchemy `commit` listener on the app's engine that timestamps every commit and
  notes which task made it: `batch` (the write-behind: event log and text flushes), `turn` (a turn's own
  durable writes) or `request` (everything else, e.g. a POST storing a message). The most commits of each
  kind within any `window` seconds tell whether the write-behind keeps its one-commit-per-interval budget.

`GET /debug/stats` answers both (and the process's CPU seconds and RSS); `POST /debug/stats/reset` starts
a new measurement window. Neither is in the published OpenAPI, and neither exists unless enabled.
"""

from __future__ import annotations

import asyncio
import math
import resource
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.deps import PrincipalDep

TICK_SECONDS = 0.01
LAG_SAMPLES = 60_000  # ten minutes of 10 ms ticks
COMMIT_SAMPLES = 200_000
WINDOW_SECONDS = 0.1


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between closest ranks; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def max_in_window(times: Iterable[float], window: float) -> int:
    """The most timestamps that fall in any half-open interval [t, t + window)."""
    ordered = sorted(times)
    best = 0
    start = 0
    for end, at in enumerate(ordered):
        while at - ordered[start] >= window:
            start += 1
        best = max(best, end - start + 1)
    return best


class LoopLag:
    """Wakes every `interval` seconds and records how late it woke, in seconds."""

    def __init__(self, interval: float = TICK_SECONDS, capacity: int = LAG_SAMPLES) -> None:
        self.interval = interval
        self.samples: deque[float] = deque(maxlen=capacity)
        self.max = 0.0
        self.count = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="debug-loop-lag")

    async def _run(self) -> None:
        interval = self.interval
        clock = time.monotonic
        while True:
            expected = clock() + interval
            await asyncio.sleep(interval)
            self.record(max(0.0, clock() - expected))

    def record(self, lag: float) -> None:
        self.samples.append(lag)
        self.count += 1
        if lag > self.max:
            self.max = lag

    def reset(self) -> None:
        self.samples.clear()
        self.max = 0.0
        self.count = 0

    def snapshot(self) -> dict[str, Any]:
        samples = list(self.samples)
        p50, p99 = percentile(samples, 50), percentile(samples, 99)
        return {
            "interval_ms": self.interval * 1000,
            "samples": self.count,
            "p50_ms": None if p50 is None else p50 * 1000,
            "p99_ms": None if p99 is None else p99 * 1000,
            "max_ms": self.max * 1000,
        }

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


def commit_origin() -> str:
    """Which kind of work commits: the write-behind's batch, a turn's own write, or a request."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        return "other"
    name = task.get_name() if task is not None else ""
    if name == "write-behind":
        return "batch"
    if name.startswith("turn:"):
        return "turn"
    return "request"


class CommitCounter:
    """Timestamps every commit on an engine, with its origin (see `commit_origin`)."""

    def __init__(self, capacity: int = COMMIT_SAMPLES) -> None:
        self.commits: deque[tuple[float, str]] = deque(maxlen=capacity)
        self.total = 0
        self._engine: AsyncEngine | None = None

    def attach(self, engine: AsyncEngine) -> None:
        event.listen(engine.sync_engine, "commit", self._on_commit)
        self._engine = engine

    def detach(self) -> None:
        if self._engine is not None:
            event.remove(self._engine.sync_engine, "commit", self._on_commit)
            self._engine = None

    def _on_commit(self, _connection: Any) -> None:
        self.commits.append((time.monotonic(), commit_origin()))
        self.total += 1

    def reset(self) -> None:
        self.commits.clear()
        self.total = 0

    def snapshot(self, window: float = WINDOW_SECONDS) -> dict[str, Any]:
        commits = list(self.commits)
        by_origin: dict[str, list[float]] = {}
        for at, origin in commits:
            by_origin.setdefault(origin, []).append(at)
        return {
            "total": self.total,
            "window_ms": window * 1000,
            "by_origin": {origin: len(times) for origin, times in sorted(by_origin.items())},
            "max_per_window": max_in_window((at for at, _ in commits), window),
            "max_per_window_by_origin": {
                origin: max_in_window(times, window) for origin, times in sorted(by_origin.items())
            },
        }


def _rss_mb() -> dict[str, float | None]:
    """Current and peak resident set size from /proc (None where /proc is not there)."""
    found: dict[str, float | None] = {"rss_mb": None, "peak_rss_mb": None}
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    found["rss_mb"] = int(line.split()[1]) / 1024
                elif line.startswith("VmHWM:"):
                    found["peak_rss_mb"] = int(line.split()[1]) / 1024
    except OSError:
        found["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return found


class DebugStats:
    """The lag ticker and the commit counter of one app, started in its lifespan."""

    def __init__(self, engine: AsyncEngine, *, interval: float = TICK_SECONDS) -> None:
        self.lag = LoopLag(interval)
        self.commits = CommitCounter()
        self.commits.attach(engine)
        self.since = time.monotonic()

    @classmethod
    def start(cls, engine: AsyncEngine, *, interval: float = TICK_SECONDS) -> DebugStats:
        stats = cls(engine, interval=interval)
        stats.lag.start()
        return stats

    def reset(self) -> None:
        self.lag.reset()
        self.commits.reset()
        self.since = time.monotonic()

    def snapshot(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "since": self.since,
            "now": now,
            "window_seconds": now - self.since,
            "cpu_seconds": time.process_time(),
            **_rss_mb(),
            "loop_lag": self.lag.snapshot(),
            "commits": self.commits.snapshot(),
        }

    async def stop(self) -> None:
        await self.lag.stop()
        self.commits.detach()


router = APIRouter(include_in_schema=False)


def _stats(request: Request) -> DebugStats:
    stats: DebugStats = request.state.debug_stats
    return stats


@router.get("/debug/stats")
async def debug_stats(request: Request, _principal: PrincipalDep) -> dict[str, Any]:
    return _stats(request).snapshot()


@router.post("/debug/stats/reset")
async def reset_debug_stats(request: Request, _principal: PrincipalDep) -> dict[str, Any]:
    stats = _stats(request)
    stats.reset()
    return stats.snapshot()
