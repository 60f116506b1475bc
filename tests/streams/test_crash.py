"""kill -9 in the middle of a turn, then a restart: real server processes, real clients that reconnect.

Two clients watch a session answering a long message; one of them loses its connection mid-answer and
reconnects; a second message is acknowledged while the answer streams; a second session is inside a tool
call. Then the server is killed with SIGKILL and started again on the same database and port. Every
client resumes with Last-Event-ID and must end with the same complete, gap-free sequence; the history
shows each interrupted turn closed cleanly, and the acknowledged message is answered after the restart.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from app.storage import repository
from app.storage.engine import Database
from app.turns.prompt import rebuild
from app.turns.recorder.stop import TOOL_INTERRUPTED_BY_RESTART
from tests.fakes.strict import validate_history
from tests.support.client import LONG, new_session, post
from tests.support.process import ServerProcess
from tests.support.stream import Frame, StreamClient, assert_contiguous

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.processes, pytest.mark.both_backends]

SLOW_CALL = "[call:slow " + json.dumps({"seconds": 20}) + "]"


def deltas_text(frames: list[Frame], message_id: str) -> str:
    return "".join(
        f.payload["text"] for f in frames if f.event == "text_delta" and f.payload["id"] == message_id
    )


async def start(server: ServerProcess) -> None:
    await asyncio.to_thread(server.start)


async def test_kill_9_mid_answer_then_restart_loses_nothing(database_url: str, tmp_path: Path) -> None:
    env = {"PARLEY_DATABASE_URL": database_url, "PARLEY_DEMO_TOKEN_DELAY": "0.005"}
    first = ServerProcess(env, tmp_path / "first.log", app="tests.support.slow_app:app")
    await start(first)
    try:
        async with httpx.AsyncClient(base_url=first.base_url, timeout=30) as client:
            sid = await new_session(client)
            tool_sid = await new_session(client)
            a, b = StreamClient(client, sid), StreamClient(client, sid)
            tool_watch = StreamClient(client, tool_sid)
            opened = [asyncio.Event() for _ in range(3)]
            reads = [
                asyncio.create_task(s.read(seconds=60, opened=o))
                for s, o in zip((a, b, tool_watch), opened, strict=True)
            ]
            for o in opened:
                await o.wait()
            posted = await post(client, sid, LONG)
            await post(client, tool_sid, SLOW_CALL)
            await a.wait(lambda frames: sum(f.event == "text_delta" for f in frames) >= 30)
            # b's connection drops mid-answer; it reconnects at once with Last-Event-ID, as EventSource does.
            reads[1].cancel()
            await asyncio.gather(reads[1], return_exceptions=True)
            cut_at = b.last_id
            reads[1] = asyncio.create_task(b.read(seconds=60))
            waiting = await post(client, sid, "and after that?")
            assert waiting["queued"] is True  # acknowledged, not taken yet
            await tool_watch.wait(lambda frames: any(f.event == "tool_exec_start" for f in frames))
            # Over a second into the answer: the write-behind has flushed part of the text by now.
            await a.wait(lambda frames: sum(f.event == "text_delta" for f in frames) >= 220)
            await asyncio.to_thread(first.kill)
            assert await asyncio.gather(*reads) == ["broken"] * 3
    finally:
        first.kill()
    assert b.connects == 2 and cut_at is not None
    seen_at_kill = a.last_id
    assert seen_at_kill is not None

    second = ServerProcess(env, tmp_path / "second.log", app="tests.support.slow_app:app", port=first.port)
    await start(second)
    try:
        async with httpx.AsyncClient(base_url=second.base_url, timeout=30) as client:
            # Every client resumes from the last id it got; a new one reads the whole log.
            for stream in (a, b, tool_watch):
                stream.client = client
            late = StreamClient(client, sid)
            resumed = await asyncio.gather(
                a.read(a.turns_done(2), seconds=30),
                b.read(b.turns_done(2), seconds=30),
                late.read(late.turns_done(2), seconds=30, params={"after": "0"}),
                tool_watch.read(tool_watch.turns_done(1), seconds=30),
            )
            assert set(resumed) == {"matched"}
            history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
    finally:
        second.kill()

    # Every client: the same complete, gap-free sequence, nothing twice.
    assert_contiguous(a.frames)
    assert b.frames == a.frames
    assert late.frames == a.frames
    assert_contiguous(tool_watch.frames)
    assert "resync" not in a.types()

    # The killed turn was closed as a stop closes one, after everything it had logged (frames still in
    # flight at the kill come first, from the log).
    types = a.types()
    cut = types.index("agent_cancelled") - 1
    closing = a.frames[cut : cut + 3]
    assert [f.event for f in closing] == ["agent_status", "agent_cancelled", "turn_done"]
    assert closing[0].id > seen_at_kill
    assert "turn_done" not in types[:cut]
    first_turn = posted["turn_id"]
    done = closing[2].payload
    assert (done["turn_id"], done["status"]) == (first_turn, "interrupted")
    assert done["duration_seconds"] > 1.0
    assert closing[0].payload["status"] == "idle"
    text_id = a.of_type("text_delta")[0]["id"]
    assert closing[1].payload["interrupted_message_ids"] == [text_id]

    # Then the message acknowledged before the kill was answered.
    assert "turn_start" in types[cut + 3 :]
    taken = [u for u in a.of_type("user_message") if u["id"] == waiting["id"]]
    assert [u["queued"] for u in taken] == [True, False]
    assert a.of_type("turn_done")[-1]["status"] == "completed"

    # The history: the partial answer kept (exactly what the clients saw) and marked, the turn closed.
    partial = next(m for m in history if m["id"] == text_id)
    assert partial["interrupted"] is True
    assert partial["content"] == deltas_text(a.frames, text_id)
    markers = [(m["type"], m.get("status")) for m in history if m["type"] in ("turn_start", "turn_done")]
    assert markers == [
        ("turn_start", None),
        ("turn_done", "interrupted"),
        ("turn_start", None),
        ("turn_done", "completed"),
    ]
    users = [m["id"] for m in history if m["type"] == "text" and m.get("role") == "user"]
    assert users == [posted["id"], waiting["id"]]

    # The session stuck in a tool call: the call has its interrupted result; the next history is valid.
    tool_tail = [f.event for f in tool_watch.frames[-3:]]
    assert tool_tail == ["agent_status", "agent_cancelled", "turn_done"]
    cancelled = tool_watch.frames[-2].payload
    assert len(cancelled["interrupted_tool_call_ids"]) == 1
    database = Database(database_url)
    try:
        async with database.session() as db:
            rows = await repository.list_messages(db, tool_sid)
            main_rows = await repository.list_messages(db, sid)
    finally:
        await database.dispose()
    tool_row = next(r for r in rows if r.type == "tool_group")
    assert (tool_row.result, tool_row.is_error) == (TOOL_INTERRUPTED_BY_RESTART, True)
    assert tool_row.tool_call_id == cancelled["interrupted_tool_call_ids"][0]
    for history_rows in (rows, main_rows):
        assert validate_history([*rebuild(history_rows, None), {"role": "user", "content": "next"}]) == []
    assert "Traceback" not in second.log()
