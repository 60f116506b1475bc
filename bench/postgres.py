"""The PostgreSQL run: the streaming sweep (default adapter) and the storage stage again, on a server whose
database is PostgreSQL, beside SQLite's figures of the same run.

The database is created for the run (`parley_bench_<pid>_<random>`) on PARLEY_BENCH_POSTGRES_URL (default
postgresql://postgres@127.0.0.1:5432/test, trust authentication) and dropped at its end. Where no
PostgreSQL answers the stage fails with one line saying so (skip it with `--skip postgres`).

Figures: server CPU per streamed chunk at 50 sessions as a ratio to SQLite's (target 1.3), GET
messages?limit=100 on the 10,000-message session at p99 (20 ms) and the replay of 10,000 events (200 ms).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench.context import Context, say
from bench.figure import Figure, get
from bench.procs import ROOT

ADMIN_URL = os.environ.get("PARLEY_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


@contextmanager
def run_database(log_path: Any, stage: str = "postgres") -> Iterator[str]:
    """A migrated database of the run's own; its async URL (PARLEY_DATABASE_URL). `stage` names what to
    skip when no PostgreSQL answers (the replicas stage uses it too)."""
    import psycopg
    from psycopg import sql
    from sqlalchemy.engine import make_url

    name = f"parley_bench_{os.getpid()}_{secrets.token_hex(4)}"
    try:
        admin = psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        raise RuntimeError(
            f"PostgreSQL not reachable at {ADMIN_URL} ({exc}); skip with --skip {stage}"
        ) from exc
    with admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_url(ADMIN_URL).set(drivername="postgresql+psycopg", database=name)
    rendered = url.render_as_string(hide_password=False)
    try:
        with log_path.open("ab") as log:
            env = {**os.environ, "PARLEY_DATABASE_URL": rendered}
            subprocess.run(
                [sys.executable, "-m", "alembic", "upgrade", "head"],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=True,
            )
        yield rendered
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


async def postgres(ctx: Context) -> dict[str, Any]:
    from bench.storage import storage
    from bench.streaming import sweep, warm_up

    adapter = ctx.config.adapters[0]
    found: dict[str, Any] = {"adapter": adapter}
    with run_database(ctx.work / "migrate-postgres.log") as url:
        say(f"postgres: sweep ({adapter}) and storage on {url.rsplit('/', 1)[-1]}")
        extra = {"PARLEY_DATABASE_URL": url}
        with ctx.server(f"sweep-postgres-{adapter}", adapter=adapter, extra=extra) as server:
            await warm_up(server)
            found["sweep"] = await sweep(ctx, server, adapter)
        found["storage"] = await storage(ctx, with_idle_streams=False, database_url=url)
    return found


def _level(levels: list[dict[str, Any]] | None, wanted: int) -> dict[str, Any] | None:
    if not levels:
        return None
    return min(levels, key=lambda level: (abs(level["concurrency"] - wanted), -level["concurrency"]))


def figures(results: dict[str, Any]) -> list[Figure]:
    run = results.get("postgres")
    adapter = get(run, "adapter") or "auto"
    on_pg = _level(get(run, "sweep", "levels"), 50)
    on_sqlite = _level(get(results, "sweep", adapter, "levels"), 50)
    pg_cpu, sqlite_cpu = get(on_pg, "cpu_per_chunk_us"), get(on_sqlite, "cpu_per_chunk_us")
    cpu_ratio = round(pg_cpu / sqlite_cpu, 2) if pg_cpu and sqlite_cpu else None
    storage = get(run, "storage")
    return [
        Figure(
            "postgres_cpu_per_chunk_ratio",
            "PostgreSQL: server CPU per streamed chunk, as a ratio to SQLite's",
            cpu_ratio,
            "x",
            1.3,
            note=f"{pg_cpu} µs on PostgreSQL, {sqlite_cpu} µs on SQLite, "
            f"{get(on_pg, 'concurrency')} sessions, adapter {adapter}",
        ),
        Figure(
            "postgres_messages_page_p99_ms",
            "PostgreSQL: GET messages?limit=100, 10k-message session, p99",
            get(storage, "pages_ms", "all", "p99"),
            "ms",
            20,
            note=f"p50 {get(storage, 'pages_ms', 'all', 'p50')} ms; "
            f"{get(storage, 'pages_ms', 'messages_in_session')} messages; server CPU "
            f"{get(storage, 'pages_ms', 'server_cpu_ms_per_page')} ms a page",
        ),
        Figure(
            "postgres_replay_ms",
            "PostgreSQL: replay of the event log on resume (median)",
            get(storage, "replay", "ms", "p50"),
            "ms",
            200,
            note=f"{get(storage, 'replay', 'events')} events; max {get(storage, 'replay', 'ms', 'max')} ms; "
            f"server CPU {get(storage, 'replay', 'server_cpu_ms_per_replay')} ms a replay",
        ),
    ]
