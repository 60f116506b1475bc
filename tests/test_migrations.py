"""Alembic migrations (migrations/, beside app/) against the tables in app.storage.tables, on SQLite and on
PostgreSQL (one history for both): the head builds exactly the models, down and up again, 0004 keeps every
row, and the files are named by date and slug."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, inspect, text
from sqlalchemy import types as sa_types
from sqlmodel import SQLModel

import app.storage.tables  # noqa: F401  (registers the tables on SQLModel.metadata)
from app.storage.engine import MIGRATION_LOCK
from tests.support.postgres import ScratchDatabase

ROOT = Path(__file__).resolve().parents[1]
VERSIONS = ROOT / "migrations" / "versions"
FILE_NAME = re.compile(
    r"(?P<y>\d{4})_(?P<m>\d{2})_(?P<d>\d{2})_(?P<rev>[0-9a-zA-Z]+)_(?P<slug>[a-z0-9_]+)\.py"
)
APP_TABLES = {
    "chat_sessions",
    "chat_messages",
    "queued_messages",
    "events",
    "idempotency_keys",
    "pending_tool_requests",
    "turn_leases",
    "context_summaries",
    "context_views",
    "files",
    "file_chunks",
    "message_files",
    "session_metadata",
    "service_secrets",
    "chat_bindings",
}


pytestmark = pytest.mark.both_backends


@pytest.fixture
def sync_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """An empty database: a SQLite file, or a PostgreSQL database of the test's own."""
    if backend == "postgresql":
        database: ScratchDatabase = request.getfixturevalue("empty_postgres_database")
        return database.url
    return f"sqlite:///{tmp_path / 'migrations.db'}"


@pytest.fixture
def config(sync_url: str) -> Config:
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.attributes["url"] = sync_url
    cfg.attributes["configure_logger"] = False
    return cfg


@pytest.fixture
def engine(sync_url: str) -> Iterator[Engine]:
    sync_engine = create_engine(sync_url)
    yield sync_engine
    sync_engine.dispose()


def _compare_default(
    _context: object,
    _inspected: object,
    metadata_column: Any,
    inspected_default: str | None,
    _metadata_default: object,
    rendered_metadata_default: str | None,
) -> bool | None:
    """JSON defaults compared as text: PostgreSQL has no `=` for json, which alembic's own check needs
    ('[]'::json = '[]'). None: alembic's comparison for every other column."""
    if not isinstance(metadata_column.type, sa_types.JSON):
        return None

    def text(default: str | None) -> str:
        return (default or "").split("::")[0].strip().strip("'\"")

    return text(inspected_default) != text(rendered_metadata_default)


def schema_diff(engine: Engine) -> list[object]:
    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"compare_type": True, "compare_server_default": _compare_default}
        )
        return list(compare_metadata(context, SQLModel.metadata))


def tables(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names())


def test_upgrade_head_builds_exactly_the_models(config: Config, engine: Engine) -> None:
    command.upgrade(config, "head")
    assert tables(engine) == APP_TABLES | {"alembic_version"}
    assert schema_diff(engine) == []


def test_an_empty_database_differs_from_the_models(engine: Engine) -> None:
    # The comparison itself can fail: without migrations every table is missing.
    diff = schema_diff(engine)
    added = {op[1].name for op in diff if isinstance(op, tuple) and op[0] == "add_table"}
    assert added == APP_TABLES


def test_the_comparison_sees_a_missing_index(config: Config, engine: Engine) -> None:
    command.upgrade(config, "head")
    with engine.begin() as connection:
        connection.execute(text("DROP INDEX ix_chat_messages_turn"))
    diff = schema_diff(engine)
    assert [(op[0], op[1].name) for op in diff if isinstance(op, tuple)] == [
        ("add_index", "ix_chat_messages_turn")
    ]


def test_downgrade_to_base_then_upgrade_again(config: Config, engine: Engine) -> None:
    command.upgrade(config, "head")
    command.downgrade(config, "base")
    assert tables(engine) <= {"alembic_version"}
    with engine.connect() as connection:
        assert MigrationContext.configure(connection).get_current_revision() is None
    command.upgrade(config, "head")
    assert schema_diff(engine) == []
    head = ScriptDirectory.from_config(config).get_current_head()
    with engine.connect() as connection:
        assert MigrationContext.configure(connection).get_current_revision() == head


def test_migrations_form_one_line_with_one_head(config: Config) -> None:
    scripts = ScriptDirectory.from_config(config)
    assert len(scripts.get_heads()) == 1
    assert len(scripts.get_bases()) == 1


def test_migration_file_names(config: Config) -> None:
    files = sorted(path.name for path in VERSIONS.glob("*.py"))
    assert files, "no migrations found"
    for name in files:
        match = FILE_NAME.fullmatch(name)
        assert match is not None, f"{name} is not YYYY_MM_DD_<rev>_<slug>.py"
        date(int(match["y"]), int(match["m"]), int(match["d"]))  # a real date
    by_file = {
        Path(script.path).name: script.revision
        for script in ScriptDirectory.from_config(config).walk_revisions()
    }
    assert sorted(by_file) == files
    for name, revision in by_file.items():
        match = FILE_NAME.fullmatch(name)
        assert match is not None
        assert match["rev"] == revision, f"{name} holds revision {revision!r}"


def test_0004_keeps_every_row_and_gives_old_sessions_the_open_mode_principal(
    config: Config, engine: Engine
) -> None:
    command.upgrade(config, "0003")
    at = "2026-11-22T00:00:00.000+00:00"
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO chat_sessions (id, model, tools, status, created_at, updated_at, total_tokens,"
                " context_used) VALUES ('s_old', 'parley/demo', '[]', 'active', :at, :at, 0, 0)"
            ),
            {"at": at},
        )
        connection.execute(
            text(
                "INSERT INTO chat_messages (id, session_id, turn_id, type, role, content, sender, timestamp)"
                " VALUES ('m_old', 's_old', 't_old', 'text', 'user', 'hello', 'User', :at)"
            ),
            {"at": at},
        )
        connection.execute(
            text(
                "INSERT INTO queued_messages (id, session_id, content, sender, timestamp)"
                " VALUES ('m_wait', 's_old', 'later', 'User', :at)"
            ),
            {"at": at},
        )
    command.upgrade(config, "head")
    with engine.connect() as connection:
        assert connection.execute(text("SELECT id, principal FROM chat_sessions")).all() == [("s_old", "")]
        assert connection.execute(text("SELECT id, content, client_message_id FROM chat_messages")).all() == [
            ("m_old", "hello", None)
        ]
        assert connection.execute(text("SELECT id, client_message_id FROM queued_messages")).all() == [
            ("m_wait", None)
        ]


def test_0167_adds_chat_bindings_and_keeps_every_row(config: Config, engine: Engine) -> None:
    command.upgrade(config, "0162")
    at = "2026-11-29T00:00:00.000+00:00"
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO chat_sessions (id, principal, model, tools, status, created_at, updated_at,"
                " total_tokens, context_used)"
                " VALUES ('s_kept', 'alice', 'parley/demo', '[]', 'active', :at, :at, 0, 0)"
            ),
            {"at": at},
        )
    command.upgrade(config, "0167")
    with engine.begin() as connection:
        assert connection.execute(text("SELECT id, principal FROM chat_sessions")).all() == [
            ("s_kept", "alice")
        ]
        connection.execute(
            text(
                "INSERT INTO chat_bindings (principal, kit, chat_key, session_id, created_at)"
                " VALUES ('alice', 'ai-sdk', :key, 's_kept', :at)"
            ),
            {"key": "0" * 64, "at": at},
        )
    command.downgrade(config, "0162")
    with engine.connect() as connection:
        assert "chat_bindings" not in tables(engine)
        assert connection.execute(text("SELECT id FROM chat_sessions")).all() == [("s_kept",)]


def test_0168_keeps_every_context_view_and_gives_it_no_elided_files(config: Config, engine: Engine) -> None:
    command.upgrade(config, "0167")
    at = "2026-11-29T00:00:00.000+00:00"
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO chat_sessions (id, principal, model, tools, status, created_at, updated_at,"
                " total_tokens, context_used)"
                " VALUES ('s_kept', 'alice', 'parley/demo', '[]', 'active', :at, :at, 0, 0)"
            ),
            {"at": at},
        )
        connection.execute(
            text(
                "INSERT INTO context_views (session_id, turn_id, summary_id, summarized_turn_ids,"
                " elided_tool_call_ids, tokens_before, tokens_after, created_at)"
                " VALUES ('s_kept', 't_1', NULL, '[]', '[\"call_1\"]', 900, 400, :at)"
            ),
            {"at": at},
        )
    command.upgrade(config, "0168")
    with engine.connect() as connection:
        [(calls, files)] = connection.execute(
            text("SELECT elided_tool_call_ids, elided_file_ids FROM context_views")
        ).all()
        loaded = [json.loads(v) if isinstance(v, str) else v for v in (calls, files)]
        assert loaded == [["call_1"], []]
    command.downgrade(config, "0167")
    with engine.connect() as connection:
        kept = connection.execute(text("SELECT turn_id, tokens_after FROM context_views")).all()
        assert kept == [("t_1", 400)]


def test_0169_gives_messages_and_waiting_messages_a_note_and_keeps_every_row(
    config: Config, engine: Engine
) -> None:
    command.upgrade(config, "0168")
    at = "2026-11-29T00:00:00.000+00:00"
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO chat_sessions (id, principal, model, tools, status, created_at, updated_at,"
                " total_tokens, context_used)"
                " VALUES ('s_kept', 'alice', 'parley/demo', '[]', 'active', :at, :at, 0, 0)"
            ),
            {"at": at},
        )
        connection.execute(
            text(
                "INSERT INTO chat_messages (id, session_id, type, role, content, timestamp, turn_id)"
                " VALUES ('m_old', 's_kept', 'text', 'user', 'hello', :at, 't_1')"
            ),
            {"at": at},
        )
        connection.execute(
            text(
                "INSERT INTO queued_messages (id, session_id, content, sender, timestamp)"
                " VALUES ('m_wait', 's_kept', 'later', 'User', :at)"
            ),
            {"at": at},
        )
    command.upgrade(config, "0169")
    with engine.begin() as connection:
        assert connection.execute(text("SELECT id, note FROM chat_messages")).all() == [("m_old", None)]
        assert connection.execute(text("SELECT id, note FROM queued_messages")).all() == [("m_wait", None)]
        connection.execute(text("UPDATE queued_messages SET note = 'the page: billing'"))
    command.downgrade(config, "0168")
    with engine.connect() as connection:
        assert connection.execute(text("SELECT id, content FROM chat_messages")).all() == [("m_old", "hello")]
        assert connection.execute(text("SELECT id FROM queued_messages")).all() == [("m_wait",)]


@pytest.mark.processes
def test_replicas_migrating_at_once_take_turns(backend: str, sync_url: str, engine: Engine) -> None:
    """N replicas started together each run `alembic upgrade head` (as `python -m app` does): on PostgreSQL
    they queue on an advisory lock held to each migration's commit, so the first migrates and the others
    find the database at head, instead of racing on the same CREATE TABLEs. Proven by holding the lock
    here while three real alembic processes start: all three wait for it, then all succeed."""
    if backend != "postgresql":
        pytest.skip("the lock is PostgreSQL's; SQLite serves one process")
    env = {**os.environ, "PARLEY_DATABASE_URL": sync_url}
    with engine.connect() as holder:
        holder.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK})
        runs = [
            subprocess.Popen(
                [sys.executable, "-m", "alembic", "-x", f"url={sync_url}", "upgrade", "head"],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for _ in range(3)
        ]
        try:
            deadline = time.monotonic() + 120
            waiting = 0
            while waiting < 3:
                assert time.monotonic() < deadline, f"{waiting} of 3 migrations waited for the lock"
                assert all(run.poll() is None for run in runs), [run.communicate()[0] for run in runs]
                time.sleep(0.1)
                with engine.connect() as probe:
                    waiting = probe.execute(
                        text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
                    ).scalar_one()
        finally:
            holder.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK})
            holder.commit()
        outputs = [run.communicate(timeout=120)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0], outputs
    assert schema_diff(engine) == []


def test_0165_keeps_every_row_and_old_messages_have_no_attachments(config: Config, engine: Engine) -> None:
    command.upgrade(config, "0162")
    at = "2026-11-29T00:00:00.000+00:00"
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO chat_sessions (id, principal, model, tools, status, created_at, updated_at,"
                " total_tokens, context_used)"
                " VALUES ('s_old', 'alice', 'parley/demo', '[]', 'active', :at, :at, 0, 0)"
            ),
            {"at": at},
        )
        connection.execute(
            text(
                "INSERT INTO chat_messages (id, session_id, turn_id, type, role, content, sender, timestamp)"
                " VALUES ('m_old', 's_old', 't_old', 'text', 'user', 'hello', 'User', :at)"
            ),
            {"at": at},
        )
        connection.execute(
            text(
                "INSERT INTO queued_messages (id, session_id, content, sender, timestamp)"
                " VALUES ('m_wait', 's_old', 'later', 'User', :at)"
            ),
            {"at": at},
        )
    command.upgrade(config, "head")
    with engine.connect() as connection:
        assert connection.execute(text("SELECT id, principal FROM chat_sessions")).all() == [
            ("s_old", "alice")
        ]
        assert connection.execute(text("SELECT id, content, attachments FROM chat_messages")).all() == [
            ("m_old", "hello", None)
        ]
        assert connection.execute(text("SELECT id, attachments FROM queued_messages")).all() == [
            ("m_wait", None)
        ]
        assert connection.execute(text("SELECT count(*) FROM files")).scalar() == 0
    command.downgrade(config, "0162")
    with engine.connect() as connection:
        assert connection.execute(text("SELECT id, content FROM chat_messages")).all() == [("m_old", "hello")]


def test_0166_keeps_every_session_and_gives_it_empty_metadata(config: Config, engine: Engine) -> None:
    command.upgrade(config, "0162")
    at = "2026-11-28T00:00:00.000+00:00"
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO chat_sessions (id, principal, title, model, tools, status, created_at,"
                " updated_at, total_tokens, context_used) VALUES ('s_old', 'alice', 'kept', 'parley/demo',"
                " '[\"clock\"]', 'active', :at, :at, 7, 3)"
            ),
            {"at": at},
        )
    command.upgrade(config, "head")
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT id, principal, title, total_tokens, session_metadata FROM chat_sessions")
        ).all()
        assert len(rows) == 1 and rows[0][:4] == ("s_old", "alice", "kept", 7)
        metadata = rows[0][4]
        assert (json.loads(metadata) if isinstance(metadata, str) else metadata) == {}
        assert connection.execute(text("SELECT count(*) FROM session_metadata")).scalar() == 0
    command.downgrade(config, "0162")
    with engine.connect() as connection:
        assert connection.execute(text("SELECT id, title FROM chat_sessions")).all() == [("s_old", "kept")]
