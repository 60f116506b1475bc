"""`python -m app migrate-data` (app.storage.copy), as an operator runs it: a SQLite database that a real
server filled (turns with tool calls, a stopped turn, an idempotency key) is copied into an empty
PostgreSQL database by the real command in its own process. The counts are printed, a second run copies
nothing, the comparison says identical, and a server on PostgreSQL then serves byte-for-byte the same
histories and events, and goes on with new turns after them. A row changed on one side is reported."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest
from PIL import Image
from sqlalchemy import text
from sqlalchemy.engine import make_url

from app.settings import Settings
from app.storage import copy
from tests.support.client import LONG, new_session, post
from tests.support.postgres import ScratchDatabase
from tests.support.server import ROOT, live_server, migrate
from tests.support.stream import StreamClient

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def migrate_data(source: str, target: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", "migrate-data", "--from", source, "--to", target],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def counts(output: str) -> dict[str, tuple[int, int, int]]:
    """The table's rows, by table: (in source, copied, in target), under its header."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:3] == ["table", "in", "source"])
    found = {}
    for line in lines[start + 1 :]:
        parts = line.split()
        if len(parts) != 4:
            break
        found[parts[0]] = (int(parts[1]), int(parts[2]), int(parts[3]))
    return found


def assert_aligned(output: str) -> None:
    """Every row of the table ends each column where its header does (names start where `table` does)."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("table "))
    table = [line for line in lines[start:] if len(CELL.findall(line)) == 4]
    assert len(table) > 1, output
    spans = [[m.span() for m in CELL.finditer(line)] for line in table]
    header = spans[0]
    for line, row in zip(table, spans, strict=True):
        assert row[0][0] == header[0][0], line
        assert [end for _, end in row[1:]] == [end for _, end in header[1:]], "\n".join(table)


# A cell: words separated by single spaces (`in source`); columns are two spaces or more apart.
CELL = re.compile(r"\S+(?: \S+)*")


def test_the_report_is_aligned_however_long_a_name_or_a_count() -> None:
    done = [
        copy.TableCopy("chat_sessions", 3, 3, 3),
        copy.TableCopy("pending_tool_requests", 12_345_678, 0, 12_345_678),
        copy.TableCopy("events", 7, 7, 1_000_000_000),
    ]
    report = copy.copy_report(done)
    assert report[0].split("  ")[0].rstrip() == "table"
    assert_aligned("\n".join(report))
    assert counts("\n".join(report)) == {
        "chat_sessions": (3, 3, 3),
        "pending_tool_requests": (12_345_678, 0, 12_345_678),
        "events": (7, 7, 1_000_000_000),
    }


async def snapshot(base_url: str, sids: list[str]) -> dict[str, object]:
    """What clients read: every history, every turn view and every logged event, as raw bytes."""
    seen: dict[str, object] = {}
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        for sid in sids:
            seen[f"{sid}/messages"] = (await client.get(f"/v1/sessions/{sid}/messages")).content
            seen[f"{sid}/turns"] = (await client.get(f"/v1/sessions/{sid}/turns")).content
            seen[f"{sid}/session"] = (await client.get(f"/v1/sessions/{sid}")).content
            last = json.loads(seen[f"{sid}/messages"])["last_event_id"]  # type: ignore[arg-type]
            lines = []
            async with client.stream("GET", f"/v1/sessions/{sid}/events?after=0&format=ndjson") as events:
                async for line in events.aiter_lines():
                    if line:
                        lines.append(line)
                    if line and json.loads(line)["seq"] == last:
                        break
            seen[f"{sid}/events"] = lines
        for listed in (await client.get("/v1/files")).json()["files"]:
            seen[f"files/{listed['id']}"] = (
                listed,
                (await client.get(f"/v1/files/{listed['id']}/content")).content,
            )
    return seen


async def wait_post(
    client: httpx.AsyncClient, sid: str, content: str, attachments: Sequence[str] = (), **headers: str
) -> None:
    body = {"content": content, "attachments": [{"file_id": f} for f in attachments]}
    answer = await client.post(f"/v1/sessions/{sid}/messages?wait=true", json=body, headers=headers)
    assert answer.status_code == 200, answer.text


def noise(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.frombytes("RGB", (width, height), os.urandom(width * height * 3)).save(buffer, "PNG")
    return buffer.getvalue()


async def fill(settings: Settings) -> list[str]:
    """Three sessions: answered turns with tool calls, an idempotent post, a turn stopped mid-answer, a
    message with an image attached (stored in parts)."""
    with live_server(
        settings.model_copy(update={"demo_token_delay": 0.01, "files_chunk_bytes": 4096})
    ) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            sids = [await new_session(client) for _ in range(3)]
            for sid in sids:
                await wait_post(client, sid, "what time is it?")
            await wait_post(client, sids[0], "what is 2+3*4?", (), **{"Idempotency-Key": "k-1"})
            shot = noise(64, 64)  # 12 KB that do not compress: three parts of 4096 bytes
            uploaded = await client.post("/v1/files", files={"file": ("shot.png", shot)})
            assert uploaded.status_code == 201, uploaded.text
            await wait_post(client, sids[2], "what is in it?", [uploaded.json()["id"]])
            watch = StreamClient(client, sids[1])
            turn_id = (await post(client, sids[1], LONG))["turn_id"]
            await watch.read_until_type("text_delta", params={"after": "0"})
            assert (await client.post(f"/v1/sessions/{sids[1]}/cancel", json={})).status_code == 202
            ended = await client.get(f"/v1/sessions/{sids[1]}/turns/{turn_id}?wait=true")
            assert ended.json()["status"] == "cancelled"
    return sids


async def test_a_sqlite_database_copied_into_postgresql_serves_the_same_histories(
    settings: Settings, database_url: str, empty_postgres_database: ScratchDatabase
) -> None:
    sids = await fill(settings)
    source = database_url.replace("+aiosqlite", "")
    target = make_url(empty_postgres_database.url).set(drivername="postgresql")
    target_url = target.render_as_string(hide_password=False)

    first = migrate_data(source, target_url)
    assert first.returncode == 0, first.stderr
    copied = counts(first.stdout)
    assert_aligned(first.stdout)
    assert set(copied) == {
        "chat_sessions",
        "chat_messages",
        "queued_messages",
        "events",
        "idempotency_keys",
        "pending_tool_requests",
        "turn_leases",
        "files",
        "file_chunks",
        "message_files",
        "session_metadata",
        "service_secrets",
        "context_summaries",
        "context_views",
        "chat_bindings",
    }
    assert copied["chat_sessions"] == (3, 3, 3)
    assert copied["files"] == copied["message_files"] == (1, 1, 1)
    assert copied["file_chunks"][0] > 1
    assert copied["idempotency_keys"] == (1, 1, 1)
    for table, (in_source, new, in_target) in copied.items():
        assert in_source == new == in_target, table
    assert copied["events"][0] > 50
    assert "identical" in first.stdout

    again = migrate_data(source, target_url)  # idempotent: nothing twice
    assert again.returncode == 0, again.stderr
    assert {t: c[1] for t, c in counts(again.stdout).items()} == dict.fromkeys(copied, 0)
    assert "identical" in again.stdout

    before = await snapshot_of(settings, sids)
    on_postgres = settings.model_copy(update={"database_url": empty_postgres_database.url})
    after = await snapshot_of(on_postgres, sids)
    assert after == before

    # A row that differs is reported, and the command fails.
    with empty_postgres_database.connect() as conn:
        conn.execute("UPDATE chat_messages SET content = content || '!' WHERE role = 'user'")
    differing = migrate_data(source, target_url)
    assert differing.returncode == 1
    assert "chat_messages" in differing.stderr and "the databases differ" in differing.stderr
    with empty_postgres_database.connect() as conn:
        conn.execute("UPDATE chat_messages SET content = rtrim(content, '!') WHERE role = 'user'")
    assert migrate_data(source, target_url).returncode == 0

    # PostgreSQL goes on after the copied rows: a new turn lands after the history, in order.
    with live_server(on_postgres) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            await wait_post(client, sids[0], "and now?")
            history = (await client.get(f"/v1/sessions/{sids[0]}/messages")).json()["chat_messages"]
    assert [m["content"] for m in history if m.get("role") == "user"][-1] == "and now?"


async def snapshot_of(settings: Settings, sids: list[str]) -> dict[str, object]:
    with live_server(settings) as server:
        return await snapshot(server.base_url, sids)


ADD_SESSION = text(
    "INSERT INTO chat_sessions (id, principal, model, tools, status, created_at, updated_at, total_tokens,"
    " context_used) VALUES (:id, '', 'parley/demo', '[]', 'active', 't', 't', 0, 0)"
)


def test_the_comparison_sees_missing_extra_and_changed_rows(tmp_path: Path) -> None:
    """app.storage.copy between two SQLite files (the dialect-neutral part, without PostgreSQL)."""
    paths = [f"sqlite:///{tmp_path / name}" for name in ("a.db", "b.db")]
    for url in paths:
        migrate(url)
    source, target = (copy.open_engine(url) for url in paths)
    try:
        with source.begin() as conn:
            for n in range(3):
                conn.execute(
                    ADD_SESSION,
                    {"id": f"s_{n}"},
                )
        assert [c.copied for c in copy.copy_all(source, target) if c.table == "chat_sessions"] == [3]
        assert copy.differences(source, target) == []
        with target.begin() as conn:
            conn.execute(text("DELETE FROM chat_sessions WHERE id = 's_0'"))
            conn.execute(text("UPDATE chat_sessions SET title = 'x' WHERE id = 's_1'"))
            conn.execute(ADD_SESSION, {"id": "s_9"})
        found = [(d.key, d.source is None, d.target is None) for d in copy.differences(source, target)]
    finally:
        source.dispose()
        target.dispose()
    assert found == [(("s_0",), False, True), (("s_1",), False, False), (("s_9",), True, False)]
