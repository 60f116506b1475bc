"""SIGTERM to a real server process: turns stop with their state committed, the log is flushed, streams end.

uvicorn waits for open connections before it runs the lifespan's shutdown; the drain therefore starts at
the signal, so that a server with SSE clients exits within a second, without an error line.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import httpx
import pytest

from tests.support.client import LONG, new_session, post
from tests.support.process import ServerProcess
from tests.support.stream import Outcome, StreamClient, assert_contiguous

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.processes]

# A SIGTERM'd turn is closed the way a stop closes it (status "cancelled" today; see the report on
# whether "interrupted" fits a server-initiated stop better).
STOPPED = {"cancelled", "interrupted"}
# uvicorn re-raises the signal once it has shut down, so the exit status is -SIGTERM.
CLEAN_EXITS = {0, -15}


def clean(log: str) -> bool:
    return "ERROR" not in log and "Traceback" not in log and "ASGI callable returned" not in log


def database_file(database_url: str) -> str:
    return database_url.split("///", 1)[1]


async def open_readers(
    client: httpx.AsyncClient, sid: str, count: int
) -> tuple[list[StreamClient], list[asyncio.Task[Outcome]]]:
    readers = [StreamClient(client, sid) for _ in range(count)]
    opened = [asyncio.Event() for _ in readers]
    tasks = [asyncio.create_task(r.read(seconds=60, opened=o)) for r, o in zip(readers, opened, strict=True)]
    for o in opened:
        await o.wait()
    return readers, tasks


async def test_sigterm_mid_turn_commits_flushes_and_ends_the_streams(
    database_url: str, tmp_path: Path
) -> None:
    env = {"PARLEY_DATABASE_URL": database_url, "PARLEY_DEMO_TOKEN_DELAY": "0.01"}
    first = ServerProcess(env, tmp_path / "first.log")
    await asyncio.to_thread(first.start)
    try:
        async with httpx.AsyncClient(base_url=first.base_url, timeout=30) as client:
            sid = await new_session(client)
            (a, b), reads = await open_readers(client, sid, 2)
            posted = await post(client, sid, LONG)
            await a.wait(lambda frames: sum(f.event == "text_delta" for f in frames) >= 50)
            waiting = await post(client, sid, "and after that?")
            exit_seconds = await asyncio.to_thread(first.terminate)
            outcomes = await asyncio.gather(*reads)
    finally:
        first.kill()

    assert exit_seconds < 5.0, exit_seconds
    assert first.returncode in CLEAN_EXITS
    assert clean(first.log()), first.log()
    # The streams ended (they did not break), after the turn's closing events.
    assert outcomes == ["ended", "ended"]
    assert_contiguous(a.frames)
    assert b.frames == a.frames
    types = a.types()
    assert types[-3:] == ["agent_status", "agent_cancelled", "turn_done"]  # as a stop ends
    done = a.frames[-1].payload
    assert (done["turn_id"], done["status"] in STOPPED) == (posted["turn_id"], True)
    assert "turn_start" not in types[types.index("turn_done") :]  # the waiting message was not started

    # Committed and flushed before the exit: the events every client saw, the partial text, the turn's end.
    text_id = a.of_type("text_delta")[0]["id"]
    with sqlite3.connect(database_file(database_url)) as conn:
        logged = conn.execute("SELECT max(seq) FROM events WHERE session_id = ?", (sid,)).fetchone()[0]
        partial = conn.execute(
            "SELECT content, interrupted FROM chat_messages WHERE id = ?", (text_id,)
        ).fetchone()
        closed = conn.execute(
            "SELECT status FROM chat_messages WHERE turn_id = ? AND type = 'turn_done'", (posted["turn_id"],)
        ).fetchall()
        queued = conn.execute("SELECT id FROM queued_messages WHERE session_id = ?", (sid,)).fetchall()
    assert logged == a.last_id
    assert partial == ("".join(d["text"] for d in a.of_type("text_delta")), 1)
    assert [status for (status,) in closed] == [done["status"]]
    assert queued == [(waiting["id"],)]  # acknowledged, so kept for the next process

    second = ServerProcess(env, tmp_path / "second.log", port=first.port)
    await asyncio.to_thread(second.start)
    try:
        async with httpx.AsyncClient(base_url=second.base_url, timeout=30) as client:
            for reader in (a, b):
                reader.client = client
            resumed = await asyncio.gather(*(r.read(r.turns_done(2), seconds=30) for r in (a, b)))
            assert resumed == ["matched", "matched"]
            # Idle clients do not hold a shutdown up.
            _, reads = await open_readers(client, sid, 3)
            idle_exit = await asyncio.to_thread(second.terminate)
            assert await asyncio.gather(*reads) == ["ended"] * 3
    finally:
        second.kill()

    assert_contiguous(a.frames)
    assert b.frames == a.frames
    assert "resync" not in a.types()
    assert [u["id"] for u in a.of_type("user_message")][-1] == waiting["id"]
    assert a.of_type("turn_done")[-1]["status"] == "completed"
    assert idle_exit < 1.0, idle_exit
    assert clean(second.log()), second.log()
    print(
        f"SIGTERM exit: {exit_seconds:.3f} s mid-turn with 2 clients, {idle_exit:.3f} s with 3 idle clients"
    )
