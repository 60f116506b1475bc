"""The burst stage: many turns posted at the same moment, against the raw upstream in the same run.

Issue 32's target: 50 turns posted at the same moment on 50 fresh sessions, each session's event stream
already open; the first text at the client, p50, at most the raw upstream's own first chunk + 100 ms,
where the raw upstream is a direct client to the same fake upstream measured in the same run.

Each round, on one server (fresh database, one warm-up turn):

1. *Raw*: `burst_sessions` direct requests to the fake upstream, started at the same moment by one
   client (raw asyncio HTTP, a connection each, opened inside the timing as a fresh client opens it):
   request written (connect included) → the first content chunk read. The upstream's own (request
   received → first text chunk written) is beside it.
2. *Server*: `burst_sessions` fresh sessions are created and their event streams opened, each session's
   connection is used once more (so that the POSTs go on warm keep-alive connections), then every
   session's POST is written in the same loop iteration: POST written → its first `text_delta` read. The
   window is bracketed like a sweep level's (server CPU, loop lag, commits by origin).

Both read answers of `--chunks` at `--delay-ms` to the end. The figures pool every round's turns; each
round's p50 is in the JSON too.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from bench import summary
from bench.client import HOST, HttpConn, _chunk_size, _chunked, _read_head
from bench.context import Context, say
from bench.load import BENCH_MODEL, Probe, Session, Turn, close_sessions, open_sessions
from bench.procs import ServerProcess
from bench.stats import dist, median
from bench.streaming import warm_up
from tests.fakes.directive import bench_content

MS = 1000.0


def _has_content(event: bytes) -> bool:
    for line in event.split(b"\n"):
        if line.startswith(b"data: {"):
            choices = json.loads(line[6:]).get("choices") or []
            if choices and (choices[0].get("delta") or {}).get("content"):
                return True
    return False


async def _raw_stream(port: int, tag: str, body: bytes, gate: asyncio.Event) -> dict[str, Any]:
    """One direct request: connect, write, read the stream to its end; when the first content came."""
    await gate.wait()
    start = time.monotonic()
    first: float | None = None
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode() + body)
        status, headers = await _read_head(reader)
        if status != 200 or not _chunked(headers):
            raise RuntimeError(f"upstream answered {status}")
        buffer = bytearray()
        while True:
            size = _chunk_size(await reader.readline())
            if size == 0:
                break
            data = await reader.readexactly(size + 2)
            if first is None:
                buffer += data[:-2]
                if _has_content(bytes(buffer)):
                    first = time.monotonic()
                buffer.clear()
    finally:
        writer.close()
    return {"tag": tag, "start": start, "first": first, "end": time.monotonic()}


async def raw_burst(ctx: Context, round_: int) -> dict[str, Any]:
    config = ctx.config
    gate = asyncio.Event()
    tasks = []
    for i in range(config.burst_sessions):
        tag = f"burst-raw-{round_}-{i}"
        payload = {
            "model": "bench",
            "stream": True,
            "messages": [{"role": "user", "content": bench_content(tag, config.chunks, config.delay_ms)}],
        }
        body = json.dumps(payload).encode()
        tasks.append(asyncio.create_task(_raw_stream(ctx.upstream.port, tag, body, gate)))
    await asyncio.sleep(0)  # every task waits at the gate
    ctx.upstream.reset()
    gate.set()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    streams = [d for d in done if isinstance(d, dict)]
    failed = [repr(d)[:300] for d in done if not isinstance(d, dict)]
    upstream = ctx.upstream.by_tag()
    return {
        "turns": len(done),
        "errors": {"count": len(failed), "first": failed[0] if failed else None},
        "first_text_ms": dist((_delta(s["first"], s["start"]) for s in streams), MS),
        "_first_text_s": [_delta(s["first"], s["start"]) for s in streams],
        "_upstream_first_s": [
            _delta(_at(upstream.get(s["tag"]), "first"), _at(upstream.get(s["tag"]), "start"))
            for s in streams
        ],
    }


def _delta(later: float | None, earlier: float | None) -> float | None:
    return None if later is None or earlier is None else later - earlier


def _at(record: dict[str, Any] | None, key: str) -> float | None:
    value = None if record is None else record.get(key)
    return float(value) if isinstance(value, int | float) else None


async def _post_all(
    sessions: list[Session], round_: int, chunks: int, delay_ms: float, timeout: float
) -> list[Turn]:
    gate = asyncio.Event()

    async def one(session: Session) -> Turn:
        tag = f"burst-server-{round_}-{session.index}"
        text = bench_content(tag, chunks, delay_ms)
        await gate.wait()
        return await session.turn(tag, round_, text, timeout, None)

    tasks = [asyncio.create_task(one(s)) for s in sessions]
    await asyncio.sleep(0)
    gate.set()
    return list(await asyncio.gather(*tasks))


async def server_burst(ctx: Context, server: ServerProcess, round_: int) -> tuple[list[Turn], dict[str, Any]]:
    config = ctx.config
    sessions = await open_sessions(server.port, config.burst_sessions, BENCH_MODEL)
    control = HttpConn(server.port)
    try:
        # Each POST goes on a warm keep-alive connection (HttpConn replaces one idle for over 3 s).
        await asyncio.gather(*(s.conn.json("GET", f"/v1/sessions/{s.id}") for s in sessions))
        await asyncio.sleep(0.2 if not config.smoke else 0.02)
        probe = Probe(server, ctx.upstream, control)
        await probe.start()
        turns = await _post_all(sessions, round_, config.chunks, config.delay_ms, config.turn_timeout())
        await asyncio.sleep(0.3 if not config.smoke else 0.05)
        window = await probe.stop()
    finally:
        await control.close()
        await close_sessions(sessions)
    upstream = ctx.upstream.by_tag()
    ctx.dump(f"turns-burst-{round_}", [t.as_dict() for t in turns])
    return turns, {"upstream": upstream, "window": window}


async def burst(ctx: Context) -> dict[str, Any]:
    """`burst_rounds` rounds of a raw burst then a server burst, on one server."""
    config = ctx.config
    rounds: list[dict[str, Any]] = []
    raw_firsts: list[float | None] = []
    raw_upstream: list[float | None] = []
    all_turns: list[Turn] = []
    all_upstream: dict[str, dict[str, Any]] = {}
    load_start = os.getloadavg()
    with ctx.server("burst") as server:
        await warm_up(server)
        for round_ in range(config.burst_rounds):
            say(f"burst round {round_ + 1}/{config.burst_rounds}: {config.burst_sessions} turns at once")
            raw = await raw_burst(ctx, round_)
            raw_firsts += raw.pop("_first_text_s")
            own = raw.pop("_upstream_first_s")
            raw_upstream += own
            raw["upstream_first_text_ms"] = dist(own, MS)
            turns, found = await server_burst(ctx, server, round_)
            all_turns += turns
            all_upstream.update(found["upstream"])
            level = summary.streaming(turns, found["upstream"], found["window"], 0.0)
            server_round = {
                key: level[key]
                for key in (
                    "turns",
                    "statuses",
                    "errors",
                    "first_text_ms",
                    "first_event_ms",
                    "post_to_accepted_ms",
                    "post_to_request_ms",
                    "upstream_first_text_ms",
                    "first_text_added_ms",
                    "cpu_per_chunk_us",
                    "window",
                )
            }
            rounds.append({"round": round_, "raw": raw, "server": server_round})
            say(
                f"  first text p50 {server_round['first_text_ms']['p50']} ms "
                f"p99 {server_round['first_text_ms']['p99']} ms (POST -> upstream request p50 "
                f"{server_round['post_to_request_ms']['p50']} ms, 202 p50 "
                f"{server_round['post_to_accepted_ms']['p50']} ms); raw upstream first chunk p50 "
                f"{raw['first_text_ms']['p50']} ms p99 {raw['first_text_ms']['p99']} ms; "
                f"commits {found['window']['commits']['by_origin']}"
            )
    pooled = summary.streaming(all_turns, all_upstream, {"server_cpu_s": 0.0, "wall_s": 0.0}, 0.0)
    return {
        "sessions": config.burst_sessions,
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "rounds": rounds,
        "errors": {
            "count": sum(r["server"]["errors"]["count"] + r["raw"]["errors"]["count"] for r in rounds),
            "first": next(
                (
                    r[side]["errors"]["first"]
                    for r in rounds
                    for side in ("server", "raw")
                    if r[side]["errors"]["first"]
                ),
                None,
            ),
        },
        "server": {
            key: pooled[key]
            for key in (
                "first_text_ms",
                "first_event_ms",
                "post_to_accepted_ms",
                "post_to_request_ms",
                "upstream_first_text_ms",
                "first_text_added_ms",
            )
        },
        "raw": {
            "first_text_ms": dist(raw_firsts, MS),
            "upstream_first_text_ms": dist(raw_upstream, MS),
        },
        "round_p50_ms": {
            "server": [r["server"]["first_text_ms"]["p50"] for r in rounds],
            "raw": [r["raw"]["first_text_ms"]["p50"] for r in rounds],
            "server_median": median(r["server"]["first_text_ms"]["p50"] for r in rounds),
            "raw_median": median(r["raw"]["first_text_ms"]["p50"] for r in rounds),
        },
    }
