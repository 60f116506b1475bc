"""Suspended turns survive the process: kill -9 (and SIGTERM) while calls wait, then a restart on the
same database and port. Real server processes, a real socket, the strict fake upstream in this process.

After kill -9 the request that still waited is answerable, an answer given before the kill is a replay
(stored once), the server tool that was running when the process died gets the restart's interrupted
result and is not run again (it would take 30 s and answer "waited"), and the answer resumes the turn
with a history the strict upstream accepts. After SIGTERM the expiry timer is re-armed from the stored
expiry: the unanswered approval expires after the restart and the model reads "approval timed out".
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from app.turns.recorder.stop import TOOL_INTERRUPTED_BY_RESTART
from tests.fakes.upstream import FakeUpstream, Script
from tests.interrupt.conftest import MODEL, write_models_file
from tests.interrupt.session import assert_strictly_valid, chat_requests
from tests.support.process import ServerProcess
from tests.support.sse import EventReader
from tests.tool_requests.helpers import LOCATION, calls

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.processes]

SESSION = {
    "tools": ["calculate", "slow"],
    "approval": ["calculate"],
    "client_tools": [LOCATION],
}


def _env(database_url: str, models: Path, **extra: str) -> dict[str, str]:
    return {
        "PARLEY_DATABASE_URL": database_url,
        "PARLEY_MODELS_FILE": str(models),
        "PARLEY_DEFAULT_MODEL": MODEL,
        **extra,
    }


async def _start(env: dict[str, str], log: Path, port: int | None = None) -> ServerProcess:
    server = ServerProcess(env, log, app="tests.support.slow_app:app", port=port)
    await asyncio.to_thread(server.start, 60.0)
    return server


async def test_kill_9_while_waiting_then_answer_after_the_restart(
    database_url: str, tmp_path: Path, upstream: FakeUpstream
) -> None:
    models = write_models_file(tmp_path, upstream.base_url)
    upstream.enqueue(
        calls(
            ("call_slow", "slow", json.dumps({"seconds": 30})),
            ("call_c", "calculate", '{"expression": "6*7"}'),
            ("call_loc", "get_location", "{}"),
            text="On it.",
        ),
        Script.text("Paris, and 42."),
        Script.text("Anything else?"),
    )
    env = _env(database_url, models)
    first = await _start(env, tmp_path / "first.log")
    try:
        async with httpx.AsyncClient(base_url=first.base_url, timeout=30) as client:
            created = await client.post("/v1/sessions", json=SESSION)
            sid = created.json()["id"]
            async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
                posted = (await client.post(f"/v1/sessions/{sid}/messages", json={"content": "go"})).json()
                await reader.wait_type("approval_requested", timeout=60)
                await reader.wait_type("client_tool_requested")
                result = {"tool_call_id": "call_loc", "output": "Paris"}
                answered = await client.post(f"/v1/sessions/{sid}/tool_results", json={"results": [result]})
                assert answered.status_code == 200, answered.text
                # acknowledged: committed before the reply, so the kill cannot lose it
                await asyncio.to_thread(first.kill)
    finally:
        first.kill()

    second = await _start(env, tmp_path / "second.log", port=first.port)
    try:
        async with httpx.AsyncClient(base_url=second.base_url, timeout=30) as client:
            base = f"/v1/sessions/{sid}"
            waiting = (await client.get(f"{base}/pending")).json()["pending"]
            assert [(p["tool_call_id"], p["kind"]) for p in waiting] == [("call_c", "approval")]
            assert (await client.get(base)).json()["agent_status"] == "awaiting_input"
            # The answer given before the kill: a replay, not a second result.
            again = await client.post(f"{base}/tool_results", json={"results": [result]})
            assert (again.status_code, again.json()["resolved"][0]["replayed"]) == (200, True)
            async with EventReader(client, f"{base}/events?after=0") as reader:
                approve = {"decisions": [{"tool_call_id": "call_c", "decision": "approve"}]}
                approved = await client.post(f"{base}/approvals", json=approve)
                assert approved.status_code == 200, approved.text
                [done] = await reader.wait_for(
                    lambda e: e.event == "turn_done" and e.data["turn_id"] == posted["turn_id"], timeout=60
                )
                assert done.data["status"] == "completed"
                ends = {
                    e["tool_result"]["tool_call_id"]: e["tool_result"]
                    for e in reader.of_type("tool_exec_end")
                }
                types = [e.event for e in reader.events]
                seqs = [int(e.id) for e in reader.events]
            assert seqs == list(range(1, len(seqs) + 1))  # one gap-free log across the kill
            assert types.count("turn_start") == 1 and types.count("turn_done") == 1
            nxt = await client.post(f"{base}/messages", json={"content": "thanks"}, params={"wait": "true"})
            assert nxt.status_code == 200 and nxt.json()["status"] == "completed", nxt.text
            history = (await client.get(f"{base}/messages")).json()["chat_messages"]
    finally:
        second.kill()

    # The slow tool that ran at the kill: interrupted, never run again; the others as answered.
    assert ends["call_slow"]["content"] == TOOL_INTERRUPTED_BY_RESTART
    assert (ends["call_loc"]["content"], ends["call_c"]["content"]) == ("Paris", "42")
    results = [m for m in chat_requests(upstream)[1].body["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == ["call_slow", "call_c", "call_loc"]
    assert len(chat_requests(upstream)) == 3
    assert_strictly_valid(upstream)
    rows = {m["tool_call_id"]: m for m in history if m["type"] == "tool_group"}
    assert rows["call_slow"]["interrupted"] is True
    assert (rows["call_c"]["decision"], rows["call_loc"]["executed_by"]) == ("approve", "client")
    assert "Traceback" not in second.log()


async def test_sigterm_while_waiting_keeps_the_request_and_its_expiry(
    database_url: str, tmp_path: Path, upstream: FakeUpstream
) -> None:
    models = write_models_file(tmp_path, upstream.base_url)
    upstream.enqueue(calls(("call_c", "calculate", '{"expression": "1+1"}')), Script.text("Not approved."))
    env = _env(database_url, models, PARLEY_APPROVAL_TIMEOUT="30")
    first = await _start(env, tmp_path / "first.log")
    try:
        async with httpx.AsyncClient(base_url=first.base_url, timeout=30) as client:
            sid = (await client.post("/v1/sessions", json=SESSION)).json()["id"]
            async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
                await client.post(f"/v1/sessions/{sid}/messages", json={"content": "1+1?"})
                [requested] = await reader.wait_type("approval_requested", timeout=60)
        await asyncio.to_thread(first.terminate)
    finally:
        first.kill()
    second = await _start(env, tmp_path / "second.log", port=first.port)
    try:
        async with httpx.AsyncClient(base_url=second.base_url, timeout=30) as client:
            base = f"/v1/sessions/{sid}"
            [waiting] = (await client.get(f"{base}/pending")).json()["pending"]
            assert waiting["expires_at"] == requested.data["expires_at"]  # the same expiry, not a new one
            async with EventReader(client, f"{base}/events?after=0") as reader:
                # 30 s from the request (a bound for starting two servers on a busy machine)
                [done] = await reader.wait_for(lambda e: e.event == "turn_done", timeout=90)
            assert done.data["status"] == "completed"
            assert [e["decision"] for e in reader.of_type("approval_resolved")] == ["expired"]
    finally:
        second.kill()
    results = [m for m in chat_requests(upstream)[1].body["messages"] if m["role"] == "tool"]
    assert results[0]["content"] == "approval timed out"
    assert_strictly_valid(upstream)
    assert "Traceback" not in first.log() + second.log()
