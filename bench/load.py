"""The load: sessions that post turns back to back and time each turn from their own event stream.

A session keeps one keep-alive connection for its requests and one open event stream for the whole stage.
Each turn is timed on the client's clock (`time.monotonic()`, the clock the upstream records with):
`posted` just before the POST is written, then the first arrival of every event type of that turn. A
stage's window is bracketed by `Probe`: server CPU from /proc (every thread), the upstream's and the load
client's own CPU (to show they are not the bottleneck), and the server's /debug/stats (loop lag, commits).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from bench.client import EventStream, HttpConn, HttpError
from bench.procs import ServerProcess, UpstreamProcess, core_busy_seconds, runqueue_wait_seconds

BENCH_MODEL = "openai/bench"
# The same upstream read as Anthropic's Messages API (bench/context.py's models file).
ANTHROPIC_MODEL = "anthropic/bench"


def bench_model(adapter: str) -> str:
    """The model a sweep or stop of this adapter streams: the Anthropic path's own, else the OpenAI one."""
    return ANTHROPIC_MODEL if adapter == "anthropic" else BENCH_MODEL


@dataclass
class Turn:
    tag: str
    session: int
    round: int
    posted: float
    accepted: float | None = None
    first_event: float | None = None
    first_text: float | None = None
    done: float | None = None
    cancel_sent: float | None = None
    cancel_status: int | None = None
    cancel_answered: float | None = None
    cancelled: float | None = None
    text_deltas: int = 0
    status: str | None = None
    server_seconds: float | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# What a session posts for round r: (tag, content).
Content = Callable[["Session", int], tuple[str, str]]
# Seconds after the turn's first text_delta to send a stop, or None to let it finish.
CancelPlan = Callable[[int, int], float | None]


class Session:
    def __init__(
        self, port: int, index: int, session_id: str, conn: HttpConn, *, arrivals: bool = False
    ) -> None:
        self.port = port
        self.index = index
        self.id = session_id
        self.conn = conn
        # Where stops go: the session's own connection, or (bench/replicas.py) one to another replica.
        self.cancel_conn = conn
        self.stream = EventStream(port, session_id, arrivals=arrivals)

    @classmethod
    async def create(cls, port: int, index: int, model: str, *, arrivals: bool = False) -> Session:
        conn = HttpConn(port)
        body = await conn.json("POST", "/v1/sessions", {"model": model, "tools": []}, expect=201)
        session = cls(port, index, str(body["id"]), conn, arrivals=arrivals)
        await session.stream.open()
        return session

    async def turn(
        self, tag: str, round_: int, content: str, timeout: float, cancel_after: float | None
    ) -> Turn:
        stream = self.stream
        stream.reset()
        turn = Turn(tag, self.index, round_, time.monotonic())
        try:
            await self.conn.json("POST", f"/v1/sessions/{self.id}/messages", {"content": content}, expect=202)
            turn.accepted = time.monotonic()
            if cancel_after is not None:
                await self._cancel(turn, cancel_after, timeout)
            turn.done = await stream.wait("turn_done", timeout)
        except (TimeoutError, RuntimeError, HttpError, OSError, asyncio.IncompleteReadError) as exc:
            turn.error = repr(exc)[:300]
        turn.first_event = min(stream.first.values(), default=None)
        turn.first_text = stream.first.get("text_delta")
        turn.text_deltas = stream.counts["text_delta"]
        done = stream.data.get("turn_done")
        if done:
            turn.status = str(done[-1].get("status"))
            seconds = done[-1].get("duration_seconds")
            turn.server_seconds = float(seconds) if isinstance(seconds, int | float) else None
        return turn

    async def _cancel(self, turn: Turn, after: float, timeout: float) -> None:
        first = await self.stream.wait("text_delta", timeout)
        await asyncio.sleep(max(0.0, first + after - time.monotonic()))
        turn.cancel_sent = time.monotonic()
        status, _ = await self.cancel_conn.request("POST", f"/v1/sessions/{self.id}/cancel", {})
        turn.cancel_answered = time.monotonic()
        turn.cancel_status = status
        # 200 means the turn had already ended by itself: not a stop, so nothing to wait for.
        if status == 202:
            turn.cancelled = await self.stream.wait("agent_cancelled", timeout)

    async def close(self) -> None:
        await self.stream.close()
        await self.conn.close()
        if self.cancel_conn is not self.conn:
            await self.cancel_conn.close()


async def open_sessions(port: int, count: int, model: str, parallel: int = 32) -> list[Session]:
    """`count` sessions, each with its event stream open, created `parallel` at a time."""
    gate = asyncio.Semaphore(parallel)

    async def one(index: int) -> Session:
        async with gate:
            return await Session.create(port, index, model)

    return list(await asyncio.gather(*(one(i) for i in range(count))))


async def close_sessions(sessions: list[Session]) -> None:
    await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)


async def drive(
    sessions: list[Session],
    rounds: int,
    ramp_s: float,
    content: Content,
    timeout: float,
    cancel: CancelPlan | None = None,
) -> list[Turn]:
    """Every session runs `rounds` turns back to back; session i starts at i * ramp_s / len(sessions)."""
    spacing = ramp_s / len(sessions) if sessions else 0.0

    async def run(session: Session) -> list[Turn]:
        await asyncio.sleep(session.index * spacing)
        turns = []
        for round_ in range(rounds):
            tag, text = content(session, round_)
            after = cancel(session.index, round_) if cancel is not None else None
            turns.append(await session.turn(tag, round_, text, timeout, after))
        return turns

    per_session = await asyncio.gather(*(run(s) for s in sessions))
    return [turn for turns in per_session for turn in turns]


def every_other(after_s: float, jitter_s: float, seed: int = 7) -> CancelPlan:
    """Stops the even-numbered sessions' turns `after_s` + up to `jitter_s` after their first text."""
    rng = random.Random(seed)
    plan: dict[tuple[int, int], float] = {}

    def cancel(session: int, round_: int) -> float | None:
        if session % 2:
            return None
        return plan.setdefault((session, round_), after_s + rng.random() * jitter_s)

    return cancel


class Probe:
    """Brackets a measurement window: CPU of the server, upstream and client; the server's debug stats."""

    def __init__(self, server: ServerProcess, upstream: UpstreamProcess, conn: HttpConn) -> None:
        self.server = server
        self.upstream = upstream
        self.conn = conn
        self._start: dict[str, float] = {}

    async def start(self) -> None:
        await self.conn.json("POST", "/debug/stats/reset")
        self.server.reset_peak()
        self.upstream.reset()
        self._start = {
            "wall": time.monotonic(),
            "server": self.server.cpu_seconds(),
            "upstream": self.upstream.cpu_seconds(),
            "client": time.process_time(),
            "wait": runqueue_wait_seconds(self.server.pid) or 0.0,
            "core": core_busy_seconds(self.server.cpu) or 0.0,
            "client_core": core_busy_seconds(self.upstream.cpu) or 0.0,
        }

    async def stop(self) -> dict[str, Any]:
        # CPU first: the stats request below is the harness's, not the workload's.
        wall = time.monotonic() - self._start["wall"]
        server = self.server.cpu_seconds() - self._start["server"]
        upstream = self.upstream.cpu_seconds() - self._start["upstream"]
        client = time.process_time() - self._start["client"]
        wait = runqueue_wait_seconds(self.server.pid)
        core = core_busy_seconds(self.server.cpu)
        others = None if core is None or not wall else max(0.0, core - self._start["core"] - server) / wall
        # The same on the other core, where the load client and the upstream are ours.
        busy = core_busy_seconds(self.upstream.cpu)
        own = upstream + client
        others_client = (
            None if busy is None or not wall else max(0.0, busy - self._start["client_core"] - own) / wall
        )
        stats = await self.conn.json("GET", "/debug/stats")
        memory = self.server.memory()
        return {
            "wall_s": round(wall, 3),
            "server_cpu_s": round(server, 3),
            "server_util": round(server / wall, 3) if wall else None,
            "upstream_cpu_s": round(upstream, 3),
            "upstream_util": round(upstream / wall, 3) if wall else None,
            "client_cpu_s": round(client, 3),
            "client_util": round(client / wall, 3) if wall else None,
            # Share of the window the server's loop thread was runnable but not running: how much a
            # shared machine (or the server's own threads) took from it.
            "server_wait_share": round((wait - self._start["wait"]) / wall, 3)
            if wait is not None and wall
            else None,
            # Share of the window the server's core spent on anything but the server: other processes.
            "core_others_share": None if others is None else round(others, 3),
            "client_core_others_share": None if others_client is None else round(others_client, 3),
            "loop_lag": stats["loop_lag"],
            "commits": stats["commits"],
            # Absent from servers older than these fields: the harness measures whatever it is given.
            "gc": stats.get("gc"),
            "stalls": stats.get("stalls"),
            "rss_mb": round(memory["rss_mb"], 1),
            "peak_rss_mb": round(memory["peak_rss_mb"], 1),
            # The LiteLLM child, once a LiteLLM stream started it (0 before).
            "children_rss_mb": round(memory["children_rss_mb"], 1),
        }


async def idle_cpu_rate(server: ServerProcess, seconds: float) -> float:
    """Server CPU seconds per second while nothing happens (the debug ticker, pings, timers)."""
    before = server.cpu_seconds()
    began = time.monotonic()
    await asyncio.sleep(seconds)
    return (server.cpu_seconds() - before) / (time.monotonic() - began)
