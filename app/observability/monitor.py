"""Debug statistics for benchmarks: event-loop lag and database commits, off unless PARLEY_DEBUG_STATS=1.

- `LoopLag`: a ticker task that sleeps `interval` and records how late it woke (a bounded buffer), so a
  stall of the event loop (a synchronous tail, a slow serialization) shows up as lag.
- `CommitCounter`: a SQLAlchemy `commit` listener on the app's engine that timestamps every commit and
  notes which task made it: `batch` (the write-behind's interval flush of text and events), `urgent` (its
  immediate flush of a first delta or a lone event), `turn` (a turn's own durable writes) or `request`
  (everything else, e.g. a POST storing a message). The most commits of each kind within any `window`
  seconds tell whether the write-behind keeps its one-commit-per-interval budget.

- `GcPauses`: how long the garbage collector stopped the process, per generation (a gen2 collection walks
  every object, litellm's included, so it is the usual suspect behind a long lag).
- `StallSampler`, only with PARLEY_DEBUG_STALL_MS=N as well: a thread that, whenever the loop has not
  ticked for N ms, records where the loop thread is (its innermost frames), so a lag names its cause.
  It takes the GIL every N/2 ms, which is why it is off unless asked for.

`GET /debug/stats` answers all of them (and the process's CPU seconds and RSS); `POST /debug/stats/reset`
starts a new measurement window. Neither is in the published OpenAPI, and neither exists unless enabled.
"""

from __future__ import annotations

import asyncio
import gc
import math
import resource
import sys
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

TICK_SECONDS = 0.01
LAG_SAMPLES = 60_000  # ten minutes of 10 ms ticks
COMMIT_SAMPLES = 200_000
WINDOW_SECONDS = 0.1
STALL_FRAMES = 6
STALL_TOP = 10


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
        # When the ticker last ran, and on which thread: what the stall sampler watches.
        self.beat = time.monotonic()
        self.thread_id = threading.get_ident()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.thread_id = threading.get_ident()
        self._task = asyncio.create_task(self._run(), name="debug-loop-lag")

    async def _run(self) -> None:
        interval = self.interval
        clock = time.monotonic
        while True:
            expected = clock() + interval
            await asyncio.sleep(interval)
            self.beat = now = clock()
            self.record(max(0.0, now - expected))

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


class GcPauses:
    """Time spent in each garbage collection, by generation (gc.callbacks: start/stop around each one)."""

    def __init__(self) -> None:
        self._started = 0.0
        self.reset()

    def reset(self) -> None:
        self.stats = {gen: {"count": 0, "total_ms": 0.0, "max_ms": 0.0} for gen in (0, 1, 2)}

    def attach(self) -> None:
        gc.callbacks.append(self._on_gc)

    def detach(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = (time.perf_counter() - self._started) * 1000
        stats = self.stats[int(info.get("generation", 2))]
        stats["count"] += 1
        stats["total_ms"] += pause
        stats["max_ms"] = max(stats["max_ms"], pause)

    def snapshot(self) -> dict[str, Any]:
        return {
            f"gen{gen}": {key: round(value, 3) for key, value in stats.items()}
            for gen, stats in self.stats.items()
        }


class StallSampler:
    """A thread that notes where the loop thread is whenever the lag ticker is `threshold` seconds late.

    One sample per stall (the first moment it is seen), keyed by the innermost frames of the loop thread."""

    def __init__(self, lag: LoopLag, threshold: float) -> None:
        self.lag = lag
        self.threshold = threshold
        self.stacks: Counter[str] = Counter()
        self._seen_beat = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="debug-stall-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.threshold / 2):
            beat = self.lag.beat
            if time.monotonic() - beat < self.threshold or beat == self._seen_beat:
                continue
            self._seen_beat = beat
            frame = sys._current_frames().get(self.lag.thread_id)
            if frame is not None:
                frames = traceback.extract_stack(frame)[-STALL_FRAMES:]
                self.stacks[
                    " < ".join(
                        f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}" for f in reversed(frames)
                    )
                ] += 1

    def reset(self) -> None:
        self.stacks.clear()

    def snapshot(self) -> dict[str, Any]:
        return {
            "threshold_ms": self.threshold * 1000,
            "samples": sum(self.stacks.values()),
            "top": [{"count": count, "stack": stack} for stack, count in self.stacks.most_common(STALL_TOP)],
        }

    def stop(self) -> None:
        self._stop.set()


def commit_origin() -> str:
    """Which kind of work commits: the write-behind's interval batch or urgent batch (the task names of
    app.streaming.log.write_behind), a turn's own write, or a request."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        return "other"
    name = task.get_name() if task is not None else ""
    if name == "write-behind":
        return "batch"
    if name == "write-behind:urgent":
        return "urgent"
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

    def __init__(self, engine: AsyncEngine, *, interval: float = TICK_SECONDS, stall_ms: float = 0) -> None:
        self.lag = LoopLag(interval)
        self.commits = CommitCounter()
        self.commits.attach(engine)
        self.gc = GcPauses()
        self.gc.attach()
        self.stalls = StallSampler(self.lag, stall_ms / 1000) if stall_ms > 0 else None
        self.since = time.monotonic()

    @classmethod
    def start(cls, engine: AsyncEngine, *, interval: float = TICK_SECONDS, stall_ms: float = 0) -> DebugStats:
        stats = cls(engine, interval=interval, stall_ms=stall_ms)
        stats.lag.start()
        if stats.stalls is not None:
            stats.stalls.start()
        return stats

    def reset(self) -> None:
        self.lag.reset()
        self.commits.reset()
        self.gc.reset()
        if self.stalls is not None:
            self.stalls.reset()
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
            "gc": self.gc.snapshot(),
            "stalls": self.stalls.snapshot() if self.stalls is not None else None,
        }

    async def stop(self) -> None:
        await self.lag.stop()
        self.commits.detach()
        self.gc.detach()
        if self.stalls is not None:
            self.stalls.stop()
