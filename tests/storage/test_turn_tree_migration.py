"""Migration 0163 on a database filled by the release before it (0162), on SQLite and PostgreSQL: every
session becomes a single-path tree (each turn's parent is the turn before it, the head its last turn),
no row is lost or changed, and a session without turns keeps no head. Then the server reads it: the
history and the turn view are what they were, and a new message continues from the last turn."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, text

from app.settings import Settings
from tests.support.postgres import ScratchDatabase
from tests.support.server import live_server

pytestmark = [pytest.mark.both_backends, pytest.mark.anyio]

ROOT = Path(__file__).resolve().parents[2]
AT = "2026-11-26T10:00:00.000+00:00"


@pytest.fixture
def urls(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, str]:
    """An empty database: (its synchronous URL for alembic, the server's async URL)."""
    if backend == "postgresql":
        database: ScratchDatabase = request.getfixturevalue("empty_postgres_database")
        return database.url, database.url
    path = tmp_path / "old.db"
    return f"sqlite:///{path}", f"sqlite+aiosqlite:///{path}"


@pytest.fixture
def config(urls: tuple[str, str]) -> Config:
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.attributes["url"] = urls[0]
    cfg.attributes["configure_logger"] = False
    return cfg


@pytest.fixture
def engine(urls: tuple[str, str]) -> Iterator[Engine]:
    sync_engine = create_engine(urls[0])
    yield sync_engine
    sync_engine.dispose()


def _fill_as_0162(engine: Engine) -> None:
    """Two sessions as release 0162 wrote them (two turns and none), interleaved positions."""
    with engine.begin() as connection:
        for sid in ("s_0000000000000001", "s_0000000000000002"):
            connection.execute(
                text(
                    "INSERT INTO chat_sessions (id, principal, model, tools, status, created_at, updated_at,"
                    " total_tokens, context_used, client_tools, approval, last_seq) VALUES (:id, '',"
                    " 'parley/demo', '[]', 'active', :at, :at, 0, 0, '[]', '[]', 0)"
                ),
                {"id": sid, "at": AT},
            )
        rows = [
            ("m_000000000001", "t_000000000001", "turn_start", None, None),
            ("m_000000000002", "t_000000000001", "text", "user", "first"),
            ("m_000000000003", "t_000000000001", "text", "assistant", "one"),
            ("m_000000000004", "t_000000000001", "turn_done", None, None),
            ("m_000000000005", "t_000000000002", "turn_start", None, None),
            ("m_000000000006", "t_000000000002", "text", "user", "second"),
            ("m_000000000007", "t_000000000002", "text", "assistant", "two"),
            ("m_000000000008", "t_000000000002", "turn_done", None, None),
        ]
        for mid, tid, type_, role, content in rows:
            connection.execute(
                text(
                    "INSERT INTO chat_messages (id, session_id, turn_id, type, role, content, sender,"
                    " model, status, duration_seconds, timestamp) VALUES (:id, 's_0000000000000001', :tid,"
                    " :type, :role, :content, :sender, :model, :status, :seconds, :at)"
                ),
                {
                    "id": mid,
                    "tid": tid,
                    "type": type_,
                    "role": role,
                    "content": content,
                    "sender": "User" if role == "user" else None,
                    "model": "parley/demo" if role == "assistant" else None,
                    "status": "completed" if type_ == "turn_done" else None,
                    "seconds": 0.5 if type_ == "turn_done" else None,
                    "at": AT,
                },
            )


def _messages(engine: Engine) -> list[tuple[object, ...]]:
    with engine.connect() as connection:
        return list(
            connection.execute(
                text(
                    "SELECT id, session_id, turn_id, type, role, content FROM chat_messages ORDER BY position"
                )
            ).all()
        )


async def test_old_sessions_become_single_path_trees(
    config: Config, engine: Engine, urls: tuple[str, str], settings: Settings
) -> None:
    command.upgrade(config, "0162")
    _fill_as_0162(engine)
    before = _messages(engine)
    command.upgrade(config, "0163")
    assert _messages(engine) == before
    with engine.connect() as connection:
        parents = connection.execute(
            text(
                "SELECT turn_id, parent_turn_id FROM chat_messages WHERE type = 'turn_start'"
                " ORDER BY position"
            )
        ).all()
        heads = connection.execute(text("SELECT id, head_turn_id FROM chat_sessions ORDER BY id")).all()
        others = connection.execute(
            text(
                "SELECT count(*) FROM chat_messages WHERE type <> 'turn_start' AND parent_turn_id IS NOT NULL"
            )
        ).scalar()
    assert [tuple(p) for p in parents] == [("t_000000000001", None), ("t_000000000002", "t_000000000001")]
    assert [tuple(h) for h in heads] == [
        ("s_0000000000000001", "t_000000000002"),
        ("s_0000000000000002", None),
    ]
    assert others == 0

    # The server on the migrated database (the later migrations too): the same history, a tree view, and a
    # new turn after the last.
    command.upgrade(config, "head")
    with live_server(settings.model_copy(update={"database_url": urls[1]})) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            sid = "s_0000000000000001"
            history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
            assert [m["id"] for m in history] == [row[0] for row in before]
            turns = (await client.get(f"/v1/sessions/{sid}/turns")).json()["turns"]
            assert [(t["turn_id"], t["parent_turn_id"], t["siblings"]) for t in turns] == [
                ("t_000000000001", None, ["t_000000000001"]),
                ("t_000000000002", "t_000000000001", ["t_000000000002"]),
            ]
            answer = await client.post(f"/v1/sessions/{sid}/messages?wait=true", json={"content": "third"})
            assert answer.status_code == 200, answer.text
            turn = (await client.get(f"/v1/sessions/{sid}/turns/{answer.json()['turn_id']}")).json()
            assert turn["parent_turn_id"] == "t_000000000002"
            empty = (await client.get("/v1/sessions/s_0000000000000002/messages")).json()
            assert empty["chat_messages"] == []


def test_downgrade_drops_the_tree_and_keeps_every_row(config: Config, engine: Engine) -> None:
    command.upgrade(config, "0162")
    _fill_as_0162(engine)
    before = _messages(engine)
    command.upgrade(config, "0163")
    command.downgrade(config, "0162")
    assert _messages(engine) == before
