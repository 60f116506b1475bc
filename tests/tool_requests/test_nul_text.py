"""Text PostgreSQL's `text` and `jsonb` cannot hold (U+0000, the JSON escape `\\u0000`) and the character
the storage escapes it with (U+FDD0), from every outside source, on both databases: the model's text and
tool arguments, a client tool's result, a request's fields. Each comes back as it was given, the same on
the stream and in the history, and the turn ends completed. Then the server restarts on the database after
a kill -9 and after a SIGTERM taken in the middle of such a turn, and closes it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.upstream import FakeUpstream, Script
from tests.interrupt.conftest import MODEL, write_models_file
from tests.interrupt.session import open_session
from tests.support.process import ServerProcess
from tests.support.server import LiveServer
from tests.support.sse import EventReader
from tests.tool_requests.helpers import answer, awaiting, calls

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

# Each of the three, alone and beside each other, and a backslash before the escape (then it is text).
ODD = "a\x00b \ufdd0 \ufdd00 \\u0000 \\\\u0000 \x00\x00\ufdd0\ufdd0 end"
LOOKUP = {
    "name": "look_up",
    "description": "Looks a word up on the client.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
}


def deltas(events: list[dict[str, Any]], message_id: str) -> str:
    return "".join(e["text"] for e in events if e["id"] == message_id)


async def test_nul_everywhere_is_stored_and_restored(server: LiveServer, upstream: FakeUpstream) -> None:
    arguments = json.dumps({"word": ODD})
    upstream.enqueue(calls(("call_look" + ODD, "look_up", arguments), text="Looking " + ODD))
    upstream.enqueue(Script.text("Found: " + ODD, chunks=7))
    create = {"title": "t" + ODD, "system_prompt": "s" + ODD, "client_tools": [LOOKUP]}
    async with open_session(server, **create) as session:
        posted = await session.post("q" + ODD, sender="s" + ODD, client_message_id="c" + ODD)
        assert posted.status_code == 202, posted.text
        turn_id = posted.json()["turn_id"]
        [requested] = await awaiting(session, "client_tool_requested")
        assert (requested["tool_call_id"], requested["arguments"]) == ("call_look" + ODD, {"word": ODD})
        result = {"tool_call_id": "call_look" + ODD, "output": "r" + ODD}
        status, body = await answer(session, "tool_results", results=[result])
        assert status == 200, body
        done = await session.turn_done(turn_id, timeout=30)
        assert done["status"] == "completed"
        texts = session.events("text_delta")
        history = await session.history()
        info = await session.info()

    assert (info["title"], info["system_prompt"]) == ("t" + ODD, "s" + ODD)
    [user] = [m for m in history if m.get("role") == "user"]
    assert (user["content"], user["sender"], user["client_message_id"]) == ("q" + ODD, "s" + ODD, "c" + ODD)
    replies = [m for m in history if m["type"] == "text" and m.get("role") == "assistant"]
    assert [m["content"] for m in replies] == ["Looking " + ODD, "Found: " + ODD]
    assert [deltas(texts, m["id"]) for m in replies] == ["Looking " + ODD, "Found: " + ODD]
    [group] = [m for m in history if m["type"] == "tool_group"]
    assert (group["tool_call_id"], group["arguments"], group["result"]) == (
        "call_look" + ODD,
        {"word": ODD},
        "r" + ODD,
    )
    # What the model was sent back: the prompt rebuilt from the stored rows, as given.
    second = [r for r in upstream.requests if r.path.endswith("/chat/completions")][1].body["messages"]
    assert second[0] == {"role": "system", "content": "s" + ODD}
    assert [m["content"] for m in second if m["role"] == "tool"] == ["r" + ODD]
    assert [m["content"] for m in second if m["role"] == "user"] == ["q" + ODD]


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.parametrize("stop", ["kill", "terminate"])
async def test_a_restart_after_a_turn_holding_nul(
    stop: str, database_url: str, tmp_path: Path, upstream: FakeUpstream
) -> None:
    """The turn is open (its answer still streaming) when the server stops; the restart's recovery reads
    the turn's stored events and closes it, and the history keeps the text with its NUL."""
    env = {
        "PARLEY_DATABASE_URL": database_url,
        "PARLEY_MODELS_FILE": str(write_models_file(tmp_path, upstream.base_url)),
        "PARLEY_DEFAULT_MODEL": MODEL,
    }
    pieces = ["one" + ODD, " two"] + [" more"] * 400
    upstream.enqueue(Script(text_pieces=pieces, delay=0.05))
    first = ServerProcess(env, tmp_path / "first.log")
    await asyncio.to_thread(first.start, 60.0)
    try:
        async with httpx.AsyncClient(base_url=first.base_url, timeout=30) as client:
            sid = (await client.post("/v1/sessions", json={})).json()["id"]
            async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
                posted = await client.post(f"/v1/sessions/{sid}/messages", json={"content": "x" + ODD})
                assert posted.status_code == 202, posted.text
                await reader.wait_for(
                    lambda e: e.event == "text_delta" and e.data["text"] == " two", timeout=60
                )
                # The NUL's delta is stored (the write-behind flushes every 50 ms): wait for it in the log.
                await _stored_delta(client, sid, "one" + ODD)
                await asyncio.to_thread(first.kill if stop == "kill" else first.terminate)
    finally:
        first.kill()

    second = ServerProcess(env, tmp_path / "second.log", port=first.port)
    await asyncio.to_thread(second.start, 60.0)
    try:
        async with httpx.AsyncClient(base_url=second.base_url, timeout=30) as client:
            base = f"/v1/sessions/{sid}"
            async with EventReader(client, f"{base}/events?after=0") as reader:
                [done] = await reader.wait_for(lambda e: e.event == "turn_done", timeout=30)
                streamed = "".join(e["text"] for e in reader.of_type("text_delta"))
            history = (await client.get(f"{base}/messages")).json()["chat_messages"]
            info = (await client.get(base)).json()
    finally:
        second.kill()
    assert done.data["turn_id"] == posted.json()["turn_id"]
    assert info["running_turn_id"] is None
    [user] = [m for m in history if m.get("role") == "user"]
    assert user["content"] == "x" + ODD
    [reply] = [m for m in history if m["type"] == "text" and m.get("role") == "assistant"]
    assert reply["content"].startswith("one" + ODD + " two") and reply["interrupted"] is True
    assert streamed.startswith("one" + ODD + " two")


async def _stored_delta(client: httpx.AsyncClient, sid: str, text: str) -> None:
    """Until a new reader from seq 0 is sent `text` (the log's replay reads what is stored)."""
    async with EventReader(client, f"/v1/sessions/{sid}/events?after=0") as reader:
        await reader.wait_for(lambda e: e.event == "text_delta" and e.data["text"] == text, timeout=30)
