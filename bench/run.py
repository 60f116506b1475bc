"""`python -m bench.run` (`make bench`): the whole benchmark, then latest.json, latest.md and latest.png.

Order: the upstream starts (core 1) and stays up for the whole run; cold starts; the raw-SDK baselines
(core 0, while no server runs); then per stream adapter one server (core 0) for the concurrency sweep, the
stop stage and, on the first, the demo model; a fresh server for the burst (bench/burst.py, beside direct
requests to the upstream); then a server over a seeded database for storage and idle
streams; the sweep and storage again on PostgreSQL (bench/postgres.py); the cost of a tool call per kind
of tool (bench/tools.py: its own servers, unpinned); last two replicas on PostgreSQL and Redis
(bench/replicas.py). A stage that fails is recorded
(its figures stay empty) and the run goes on; the exit status is 1 if any stage failed, whatever the
figures say: a missed target is a finding, not an error.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from bench import summary
from bench.burst import burst
from bench.compaction import measure as measure_compaction
from bench.context import Context, say
from bench.figures import build, load_runs
from bench.load import bench_model
from bench.plan import STAGES, Config, config_from, parser
from bench.postgres import postgres
from bench.procs import ROOT, Cores, UpstreamProcess, pin_self, raise_nofile
from bench.replica_report import turn_errors as replica_turn_errors
from bench.replicas import replicas
from bench.report import machine, write
from bench.retained import retained
from bench.startup import baselines, cold_start
from bench.storage import storage
from bench.streaming import demo, stop, sweep, warm_up
from bench.tools import measure as measure_tools

T = TypeVar("T")


async def guarded(results: dict[str, Any], stage: str, run: Callable[[], Awaitable[T]]) -> T | None:
    try:
        return await run()
    except Exception as exc:  # recorded in the report; the other stages still run
        error = f"{type(exc).__name__}: {exc}"
        results["errors"].append({"stage": stage, "error": error})
        say(f"stage {stage} FAILED: {error[:2000]}")
        return None


async def _cold_start(ctx: Context) -> dict[str, Any]:
    return cold_start(ctx)


async def _baselines(ctx: Context) -> dict[str, Any]:
    found = {}
    for sdk, raw in baselines(ctx).items():
        upstream = raw["upstream"]
        levels = [
            {
                "concurrency": level["concurrency"],
                "rounds": level["rounds"],
                **summary.baseline_level(level, upstream),
            }
            for level in raw["result"]["levels"]
        ]
        found[sdk] = {"sdk": sdk, "levels": levels}
    return found


async def _adapter(ctx: Context, results: dict[str, Any], adapter: str, first: bool) -> None:
    stages = ctx.config.stages
    with ctx.server(f"sweep-{adapter}", adapter=adapter) as server:
        await warm_up(server, model=bench_model(adapter))
        if "sweep" in stages:
            found = await guarded(results, f"sweep {adapter}", lambda: sweep(ctx, server, adapter))
            if found is not None:
                results.setdefault("sweep", {})[adapter] = found
        if "stop" in stages:
            found = await guarded(results, f"stop {adapter}", lambda: stop(ctx, server, adapter))
            if found is not None:
                results.setdefault("stop", {})[adapter] = found
        if "demo" in stages and first:
            results["demo"] = await guarded(results, "demo", lambda: demo(ctx, server))


async def _stages(ctx: Context, results: dict[str, Any]) -> None:
    stages = ctx.config.stages
    if "cold_start" in stages:
        results["cold_start"] = await guarded(results, "cold_start", lambda: _cold_start(ctx))
    if "baselines" in stages:
        results["baselines"] = await guarded(results, "baselines", lambda: _baselines(ctx))
    if {"sweep", "stop", "demo"} & set(stages):
        for index, adapter in enumerate(ctx.config.adapters):
            await guarded(results, f"server {adapter}", partial(_adapter, ctx, results, adapter, index == 0))
    if "burst" in stages:
        results["burst"] = await guarded(results, "burst", lambda: burst(ctx))
    if {"storage", "idle_streams"} & set(stages):
        with_streams = "idle_streams" in stages
        results["storage"] = await guarded(
            results, "storage", lambda: storage(ctx, with_idle_streams=with_streams)
        )
    if "retained" in stages:
        results["retained"] = await guarded(results, "retained", lambda: retained(ctx))
    if "postgres" in stages:
        results["postgres"] = await guarded(results, "postgres", lambda: postgres(ctx))
    if "tools" in stages:
        calls, work = ctx.config.tool_calls, ctx.work / "tools"
        measured = partial(asyncio.to_thread, measure_tools, work, calls)
        results["tools"] = await guarded(results, "tools", measured)
    if "compaction" in stages:
        turns, repeats = ctx.config.compaction_turns, ctx.config.compaction_repeats
        planned = partial(asyncio.to_thread, measure_compaction, turns, repeats)
        results["compaction"] = await guarded(results, "compaction", planned)
    if "replicas" in stages:
        results["replicas"] = await guarded(results, "replicas", lambda: replicas(ctx))


def _turn_errors(results: dict[str, Any]) -> int:
    runs = load_runs(results)
    for baseline in (results.get("baselines") or {}).values():
        runs += baseline["levels"]
    burst_errors = int((results.get("burst") or {}).get("errors", {}).get("count", 0))
    return sum(int(run["errors"]["count"]) for run in runs) + replica_turn_errors(results) + burst_errors


def _peak(ctx: Context, results: dict[str, Any]) -> float | None:
    peaks = [*ctx.server_peaks.values(), *(run["window"]["peak_rss_mb"] for run in load_runs(results))]
    return max(peaks) if peaks else None


async def run(config: Config, out: Path, work: Path) -> dict[str, Any]:
    began = time.monotonic()
    cores = Cores.plan()
    # The load client shares the upstream's core, never the server's.
    pin_self(cores.other)
    nofile = raise_nofile()  # before any child starts: the server inherits it (2,000 streams)
    results: dict[str, Any] = {"config": config.as_dict(), "machine": machine(cores), "errors": []}
    results["machine"]["nofile"] = nofile
    say(f"{cores.describe()}; work in {work}, results to {out}")
    upstream = UpstreamProcess(cores.other, config.chunks, config.delay_ms, work / "upstream.log")
    upstream.start()
    try:
        ctx = Context.prepare(config, cores, work, upstream)
        await _stages(ctx, results)
        results["server_peaks_mb"] = ctx.server_peaks
        results["peak_rss_mb"] = _peak(ctx, results)
    finally:
        upstream.stop()
    results["turn_errors"] = _turn_errors(results)
    results["machine"]["load_average_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    results["run_seconds"] = round(time.monotonic() - began, 1)
    figures = build(results)
    write(out, results, figures)
    try:
        from bench.plot import plot

        plot(results, out / "latest.png")
    except Exception as exc:  # a report without its picture is still a report
        results["errors"].append({"stage": "plot", "error": f"{type(exc).__name__}: {exc}"})
        write(out, results, figures)
    return results


def render(out: Path) -> None:
    """--render-only: the report and plot again from latest.json (after a change to how they look)."""
    results = json.loads((out / "latest.json").read_text(encoding="utf-8"))
    results.pop("figures", None)
    figures = build(results)
    write(out, results, figures)
    from bench.plot import plot

    plot(results, out / "latest.png")


def default_out(config: Config, work: Path, *, render_only: bool = False) -> Path:
    """Where a run without --out writes its report. Only a full run writes the committed figures
    (bench/results): a smoke run, or one that leaves a stage out, would replace them with a report of tiny
    sizes or of a few stages, so it writes into its work directory. --render-only re-renders the
    committed report."""
    if render_only or not (config.smoke or set(config.stages) != set(STAGES)):
        return ROOT / "bench" / "results"
    return work / "results"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    config = config_from(args)
    work = Path(args.work) if args.work else ROOT / "bench" / "work" / ("smoke" if config.smoke else "full")
    out = Path(args.out) if args.out else default_out(config, work, render_only=args.render_only)
    if args.render_only:
        render(out)
        return 0
    work.mkdir(parents=True, exist_ok=True)
    # SIGTERM stops the run as Ctrl-C does: through every `finally`, so the servers, replicas and the fake
    # upstream it started stop with it (killed outright, they were left running, loading the next run).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        import uvloop
    except ImportError:
        results = asyncio.run(run(config, out, work))
    else:
        results = uvloop.run(run(config, out, work))
    say(f"done in {results['run_seconds']} s: {out / 'latest.md'}")
    sys.stdout.write((out / "latest.md").read_text(encoding="utf-8"))
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
