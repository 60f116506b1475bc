"""Cold start, idle RSS, and the raw-SDK baselines: the stages that need no load client.

Cold start: `python -m app` spawned (the clock starts just before the fork) on a migrated database copy,
with the run's models file and without debug statistics (the production configuration); /healthz polled
until 200, then /readyz (the model layer loaded) until 200. After it, `idle_s` seconds of nothing, then
RSS and the CPU spent idling. Repeated `cold_starts` times: the first run may find a cold page cache.
"""

from __future__ import annotations

import time
from typing import Any

from bench.baseline import launch
from bench.context import Context, say
from bench.procs import runqueue_wait_seconds
from bench.stats import dist, median


def cold_start(ctx: Context) -> dict[str, Any]:
    config = ctx.config
    runs: list[dict[str, Any]] = []
    for index in range(config.cold_starts):
        label = f"cold-{index}"
        server = ctx.spawn(label, debug=False)
        try:
            started = server.wait_started()
            # Time the starting server's main thread was runnable but had no core: a busy machine.
            waited = runqueue_wait_seconds(server.pid)
            cpu = cpu_at_ready = server.cpu_seconds()
            began = time.monotonic()
            time.sleep(config.idle_s)
            idle_cpu = (server.cpu_seconds() - cpu) / (time.monotonic() - began)
            memory = server.memory()
            runs.append(
                {
                    "healthz_s": round(started.healthz_s, 3),
                    "readyz_s": round(started.readyz_s, 3),
                    "saw_loading": started.saw_loading,
                    "runqueue_wait_s": None if waited is None else round(waited, 3),
                    "cpu_at_healthz_s": round(started.cpu_at_healthz_s, 3),
                    "cpu_at_readyz_s": round(cpu_at_ready, 3),
                    "rss_at_healthz_mb": round(started.rss_at_healthz_mb, 1),
                    "idle_rss_mb": round(memory["rss_mb"], 1),
                    "idle_cpu_rate": round(idle_cpu, 4),
                }
            )
        finally:
            ctx.stop(label, server)
        say(f"cold start {index + 1}/{config.cold_starts}: {runs[-1]}")

    def of(key: str, *, with_median: bool = False) -> dict[str, Any]:
        """The distribution of one measurement over the runs; the headline ones with their median."""
        values = [r[key] for r in runs]
        return (dist(values) | {"median": median(values)}) if with_median else dist(values)

    return {
        "runs": runs,
        "healthz_s": of("healthz_s", with_median=True),
        "readyz_s": of("readyz_s", with_median=True),
        "idle_rss_mb": of("idle_rss_mb", with_median=True),
        "rss_at_healthz_mb": of("rss_at_healthz_mb"),
        "runqueue_wait_s": of("runqueue_wait_s"),
        "cpu_at_healthz_s": of("cpu_at_healthz_s"),
        "cpu_at_readyz_s": of("cpu_at_readyz_s"),
        # /readyz answered 503 at least once before 200: it does say when the model layer is loaded.
        "readyz_reports_loading": all(r["saw_loading"] for r in runs),
    }


def baselines(ctx: Context) -> dict[str, Any]:
    """Raw litellm and raw openai against the same upstream, at the sweep's levels, on the server's core."""
    config = ctx.config
    found: dict[str, Any] = {}
    for sdk in ("litellm", "openai"):
        say(f"baseline {sdk}: levels {config.levels}")
        ctx.upstream.reset()
        turns = sum(level * config.rounds(level) for level in config.levels)
        result = launch(
            sdk,
            ctx.upstream.api_base,
            levels=list(config.levels),
            rounds=[config.rounds(level) for level in config.levels],
            chunks=config.chunks,
            delay_ms=config.delay_ms,
            ramp_s=config.ramp_s,
            cpu=ctx.cores.server,
            log_path=ctx.work / f"baseline-{sdk}.log",
            timeout=120.0 + turns * config.stream_seconds() * 2,
        )
        found[sdk] = {"result": result, "upstream": ctx.upstream.by_tag()}
    return found
