"""Multi-replica mode is on with PARLEY_REDIS_URL, and only on PostgreSQL: started on SQLite, both ways of
starting the server stop with one line that says what to set and a non-zero exit, before anything is
stored. How it proves it: real subprocesses (`python -m app` and `python -m uvicorn app.main:app`), their
exit codes and stderr read, and the SQLite file they were pointed at never created."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.settings import Settings
from tests.support.server import ROOT, free_port

pytestmark = pytest.mark.slow

REDIS = "redis://127.0.0.1:6379/15"


def _env(**extra: str) -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("PARLEY_", "OTEL_"))}
    return {**kept, "PYTHONUNBUFFERED": "1", **extra}


@pytest.mark.parametrize(
    "command",
    [["-m", "app"], ["-m", "uvicorn", "app.main:app", "--host", "127.0.0.1"]],
    ids=["launcher", "uvicorn"],
)
def test_multi_replica_mode_on_sqlite_is_refused_in_one_line(tmp_path: Path, command: list[str]) -> None:
    database = tmp_path / "never.db"
    env = _env(PARLEY_DATABASE_URL=f"sqlite+aiosqlite:///{database}", PARLEY_REDIS_URL=REDIS)
    done = subprocess.run(
        [sys.executable, *command, "--port", str(free_port())],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "PARLEY_REDIS_URL" in lines[0] and "PostgreSQL" in lines[0] and "Traceback" not in done.stderr
    assert not database.exists()


def test_the_mode_and_its_timings_come_from_the_settings() -> None:
    single = Settings(_env_file=None)
    assert (single.multi_replica, single.replica_problem()) == (False, None)
    assert (single.lease_seconds, single.heartbeat_seconds) == (30.0, 10.0)
    multi = Settings(
        _env_file=None,
        redis_url=REDIS,
        database_url="postgresql+psycopg://postgres@127.0.0.1/x",
        lease_seconds=3,
    )
    assert (multi.multi_replica, multi.replica_problem(), multi.heartbeat_seconds) == (True, None, 1.0)
    slow = multi.model_copy(update={"heartbeat_interval": 3.0})
    assert "PARLEY_HEARTBEAT_INTERVAL" in (slow.replica_problem() or "")


def test_a_paused_replicas_transaction_ends_before_its_leases_do() -> None:
    """Issue 31 §3: PostgreSQL ends a transaction left idle (a process paused in it) after
    idle_in_transaction_session_timeout: with replicas 5 s, or before a lease minus a heartbeat has
    passed, so a paused owner's row locks are gone when its leases expire. A value that does not end
    before the lease (or 0, never) is refused at start. One process holds up nobody: none."""
    single = Settings(_env_file=None)
    assert (single.idle_in_transaction_timeout_ms, single.replica_problem()) == (0, None)
    multi = Settings(
        _env_file=None,
        redis_url=REDIS,
        database_url="postgresql+psycopg://postgres@127.0.0.1/x",
        lease_seconds=3,
    )
    assert multi.idle_in_transaction_timeout_ms == 2000
    assert multi.model_copy(update={"lease_seconds": 30.0}).idle_in_transaction_timeout_ms == 5000
    for refused in (0, 3000):
        paused = multi.model_copy(update={"database_idle_in_transaction_timeout_ms": refused})
        assert "PARLEY_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_MS" in (paused.replica_problem() or "")
    kept = multi.model_copy(update={"database_idle_in_transaction_timeout_ms": 2500})
    assert (kept.idle_in_transaction_timeout_ms, kept.replica_problem()) == (2500, None)
