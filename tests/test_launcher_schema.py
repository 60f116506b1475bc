"""`python -m app` against a database that was never migrated (issue 31): it migrates it before it binds
(PARLEY_MIGRATE, on by default), on SQLite and on PostgreSQL, where two replicas starting at once take
turns on the migration lock and only one of them migrates; with PARLEY_MIGRATE=false it stops with one
line that says how to migrate, instead of a traceback. Real processes, real databases."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import psycopg
import pytest

from app.storage.engine import MIGRATION_LOCK
from app.storage.schema import alembic_head, head_of_files, revisions
from tests.support.postgres import ScratchDatabase
from tests.support.server import ROOT, free_port

pytestmark = [pytest.mark.slow, pytest.mark.processes]

MIGRATED = "migrated the database"


def _env(database_url: str, **extra: str) -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("PARLEY_", "OTEL_"))}
    kept.pop("container", None)
    return {**kept, "PYTHONUNBUFFERED": "1", "PARLEY_DATABASE_URL": database_url, **extra}


@contextmanager
def launched(env: dict[str, str], log: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "app", "--port", str(port)], cwd=ROOT, env=env, stdout=out, stderr=out
        )
    try:
        yield process, f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


def until_serving(process: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + 90
    while True:
        assert process.poll() is None, f"the launcher exited:\n{log.read_text()}"
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


def a_session_is_stored(url: str) -> None:
    created = httpx.post(f"{url}/v1/sessions", json={"title": "after the migration"}, timeout=30)
    assert created.status_code == 201, created.text
    assert httpx.get(f"{url}/v1/sessions/{created.json()['id']}/messages", timeout=30).status_code == 200


def test_a_fresh_sqlite_file_is_migrated_before_the_server_serves(tmp_path: Path) -> None:
    # Not even its folder exists: a first `python -m app` on a fresh checkout.
    url = f"sqlite:///{tmp_path / 'data' / 'parley.db'}"
    log = tmp_path / "server.log"
    with launched(_env(url), log) as (process, base):
        until_serving(process, base, log)
        a_session_is_stored(base)
    assert revisions(url).at_head
    assert log.read_text().count(MIGRATED) == 1, log.read_text()
    assert "Traceback" not in log.read_text()

    # The next start finds it at head: nothing to migrate, nothing said about it.
    again = tmp_path / "again.log"
    with launched(_env(url), again) as (process, base):
        until_serving(process, base, again)
    assert MIGRATED not in again.read_text()


def test_without_migrations_it_stops_with_one_line_that_says_how_to_migrate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'parley.db'}"
    with socket.socket() as held:
        # The launcher's port, taken: had it gone as far as binding, it would say so.
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "app", "--port", str(port)],
            cwd=ROOT,
            env=_env(url, PARLEY_MIGRATE="false"),
            capture_output=True,
            text=True,
            timeout=90,
        )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("parley: the database ") and "was never migrated" in line, line
    assert "alembic upgrade head" in line and "make migrate" in line and "PARLEY_MIGRATE" in line
    assert done.stdout == ""
    assert not revisions(url).current  # it created no table either


def test_the_head_read_from_the_migration_files_is_alembics(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'parley.db'}"
    assert head_of_files() == alembic_head(url) is not None
    # Files that do not say it plainly (two heads, a computed revision) leave it to alembic.
    for name, lines in {
        "a.py": "revision = 'a'\ndown_revision = None\n",
        "b.py": "revision: str = 'b'\ndown_revision: str | None = 'a'\n",
    }.items():
        (tmp_path / name).write_text(lines)
    assert head_of_files(tmp_path) == "b"
    (tmp_path / "c.py").write_text("revision = 'c'\ndown_revision = 'a'\n")
    assert head_of_files(tmp_path) is None
    (tmp_path / "c.py").write_text("revision = 'c' + ''\ndown_revision = 'b'\n")
    assert head_of_files(tmp_path) is None


_AT_HEAD = """
import json, sys
from app.storage.schema import prepare

prepare(sys.argv[1], migrate=True)
print(json.dumps("alembic" in sys.modules))
"""


def test_a_start_at_head_does_not_import_alembic(database_url: str) -> None:
    """Its import costs 0.1-0.3 s of a cold start, for a database that is at head at nearly every start."""
    done = subprocess.run(
        [sys.executable, "-c", _AT_HEAD, database_url], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "false"


def _waiting_for_the_lock(admin: psycopg.Connection[tuple[object, ...]], database: str) -> int:
    found = admin.execute(
        "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
        " WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = %s",
        (database,),
    ).fetchone()
    return int(str(found[0])) if found else 0


def test_two_replicas_starting_at_once_on_a_fresh_postgresql_database_migrate_it_once(
    empty_postgres_database: ScratchDatabase, tmp_path: Path
) -> None:
    database = empty_postgres_database
    env = _env(database.url)
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    with database.connect() as holder, ExitStack() as stack:
        # Both replicas reach the migration while the lock is taken, so both wait on it at once.
        holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
        replicas = [stack.enter_context(launched(env, log)) for log in logs]
        deadline = time.monotonic() + 90
        while _waiting_for_the_lock(holder, database.name) < 2:
            for (process, _), log in zip(replicas, logs, strict=True):
                assert process.poll() is None, f"a replica exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, "\n".join(log.read_text() for log in logs)
            time.sleep(0.05)
        holder.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
        for (process, base), log in zip(replicas, logs, strict=True):
            until_serving(process, base, log)
            a_session_is_stored(base)
    said = [log.read_text() for log in logs]
    assert sorted(text.count(MIGRATED) for text in said) == [0, 1], said
    assert not any("Traceback" in text for text in said), said
    assert revisions(database.url).at_head
