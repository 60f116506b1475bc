"""Baselines: the same upstream read by a bare client, in a process of its own pinned like the server.

`python -m bench.baseline --sdk litellm|openai --api-base URL --levels 1,10,50,100 --rounds 5,5,2,2 ...`
runs, per level C, the load the server gets: C concurrent readers, each reading `rounds` streams back to
back, their first starts spread over `--ramp-s`. Every request is `[bench tag=...]`-tagged so the
orchestrator can join it with the upstream's own durations. It prints one JSON document: per level the
process CPU (time.process_time, every thread) over the streams, the chunks read, the event-loop lag (the
server's own ticker, app.observability.monitor.LoopLag) and every stream's start, first text chunk and end
(time.monotonic, comparable with the upstream's). `launch` runs it from the orchestrator.

- litellm: `litellm.acompletion(model="openai/bench", api_base=..., stream=True)` with include_usage,
  max_retries=0 and aclose in finally (shared notes §1-2), cost map loaded locally.
- openai: `AsyncOpenAI(base_url=..., max_retries=0).chat.completions.create(stream=True)`.

One warm-up stream runs first: the first call of either library pays for lazy imports and client set-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import AsyncIterable, Awaitable, Callable
from pathlib import Path
from typing import Any, cast

from app.observability.monitor import LoopLag
from bench.procs import ROOT, core_busy_seconds, pin_self, runqueue_wait_seconds
from tests.fakes.directive import bench_content

Reader = Callable[[str], Awaitable[dict[str, Any]]]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def message(tag: str, chunks: int, delay_ms: float) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a benchmark."},
        {"role": "user", "content": bench_content(tag, chunks, delay_ms)},
    ]


async def _timed(
    tag: str, start: float, chunks: AsyncIterable[Any], close: Callable[[], Awaitable[Any]]
) -> dict[str, Any]:
    """Reads a stream to its end (closing it whatever happens): when the first content chunk came, and
    how many did."""
    first: float | None = None
    count = 0
    try:
        async for chunk in chunks:
            choices = chunk.choices
            if choices and choices[0].delta is not None and choices[0].delta.content:
                count += 1
                if first is None:
                    first = time.monotonic()
    finally:
        await close()
    return {"tag": tag, "start": start, "first": first, "end": time.monotonic(), "chunks": count}


def litellm_reader(api_base: str, chunks: int, delay_ms: float) -> Reader:
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import litellm

    litellm.suppress_debug_info = True

    async def read(tag: str) -> dict[str, Any]:
        start = time.monotonic()
        response = await litellm.acompletion(
            model="openai/bench",
            api_base=api_base,
            api_key="bench",
            messages=message(tag, chunks, delay_ms),
            stream=True,
            stream_options={"include_usage": True},
            max_retries=0,
        )
        return await _timed(tag, start, response, response.aclose)

    return read


def openai_reader(api_base: str, chunks: int, delay_ms: float) -> Reader:
    import openai

    client = openai.AsyncOpenAI(base_url=api_base, api_key="bench", max_retries=0)

    async def read(tag: str) -> dict[str, Any]:
        start = time.monotonic()
        stream = await client.chat.completions.create(
            model="bench",
            messages=cast(Any, message(tag, chunks, delay_ms)),  # plain dicts: the SDK's TypedDicts
            stream=True,
            stream_options={"include_usage": True},
        )
        return await _timed(tag, start, stream, stream.close)

    return read


async def _level(
    read: Reader, prefix: str, level: int, rounds: int, ramp_s: float, pinned: int | None
) -> dict[str, Any]:
    """The server's load shape: `level` streams back to back for `rounds` each, starts spread over ramp_s."""
    lag = LoopLag()
    lag.start()
    await asyncio.sleep(0.05)
    lag.reset()
    errors: list[str] = []

    async def session(i: int) -> list[dict[str, Any]]:
        await asyncio.sleep(i * ramp_s / level)
        done = []
        for r in range(rounds):
            try:
                done.append(await read(f"{prefix}-{level}-{i}-{r}"))
            except Exception as exc:  # counted and reported: a baseline that fails must say so
                errors.append(repr(exc)[:300])
        return done

    cpu = time.process_time()
    wait = runqueue_wait_seconds(os.getpid())
    core = core_busy_seconds(pinned)
    began = time.monotonic()
    per_session = await asyncio.gather(*(session(i) for i in range(level)))
    ended = time.monotonic()
    cpu = time.process_time() - cpu
    waited = runqueue_wait_seconds(os.getpid())
    busy = core_busy_seconds(pinned)
    others = None if core is None or busy is None else max(0.0, busy - core - cpu)
    snapshot = lag.snapshot()
    await lag.stop()
    streams = [s for done in per_session for s in done]
    return {
        "concurrency": level,
        "rounds": rounds,
        "cpu_seconds": cpu,
        "wall_seconds": ended - began,
        "wait_seconds": None if wait is None or waited is None else waited - wait,
        "others_seconds": others,
        "chunks": sum(s["chunks"] for s in streams),
        "loop_lag": snapshot,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "streams": streams,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    make = litellm_reader if args.sdk == "litellm" else openai_reader
    read = make(args.api_base, args.chunks, args.delay_ms)
    await read(f"{args.prefix}-warmup")
    rounds = args.rounds or [1] * len(args.levels)
    if len(rounds) != len(args.levels):
        raise SystemExit("--rounds needs one value per level")
    levels = [
        await _level(read, args.prefix, level, count, args.ramp_s, args.cpu)
        for level, count in zip(args.levels, rounds, strict=True)
    ]
    return {"sdk": args.sdk, "levels": levels}


def launch(
    sdk: str,
    api_base: str,
    *,
    levels: list[int],
    rounds: list[int],
    chunks: int,
    delay_ms: float,
    ramp_s: float,
    cpu: int | None,
    log_path: Path,
    timeout: float,
) -> dict[str, Any]:
    """Runs one baseline in its own process (pinned to `cpu`) and returns its RESULT document."""
    args = [sys.executable, "-m", "bench.baseline", "--sdk", sdk, "--api-base", api_base]
    args += ["--levels", ",".join(map(str, levels)), "--rounds", ",".join(map(str, rounds))]
    args += ["--chunks", str(chunks), "--delay-ms", f"{delay_ms:g}", "--ramp-s", f"{ramp_s:g}"]
    args += ["--prefix", sdk]
    if cpu is not None:
        args += ["--cpu", str(cpu)]
    with log_path.open("ab") as log:
        done = subprocess.run(
            args, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, timeout=timeout, check=False
        )
    for line in done.stdout.decode(errors="replace").splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    raise RuntimeError(f"baseline {sdk} exited with {done.returncode} and no result; see {log_path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.baseline")
    parser.add_argument("--sdk", choices=["litellm", "openai"], required=True)
    parser.add_argument("--api-base", required=True)
    parser.add_argument("--levels", type=_ints, default=[1])
    parser.add_argument("--rounds", type=_ints, default=None, help="turns per stream, one per level")
    parser.add_argument("--ramp-s", type=float, default=0.0, help="spread the level's first starts over this")
    parser.add_argument("--chunks", type=int, default=200)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--prefix", default="base")
    parser.add_argument("--cpu", type=int, default=None)
    args = parser.parse_args(argv)
    pin_self(args.cpu)
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(run(args))
    else:
        result = uvloop.run(run(args))
    # Marked: a library may print to stdout too.
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
