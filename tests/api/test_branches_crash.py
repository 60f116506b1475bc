"""kill -9 during a regenerated turn: after the restart both branches are valid. A real server process
(kill -9 is real), the strict fake upstream in this process, the same database and port after the
restart. The regenerated turn a crash left open is closed like any other (interrupted, its streamed
text kept); the original answer is still a sibling one activate away; the next message's prompt is the
active path, accepted by the strict upstream's history rules."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fakes.upstream import FakeUpstream, Script, validate_history
from tests.support.process import ServerProcess
from tests.support.sse import EventReader

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.processes]

MODEL = "openai/strict-model"


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(strict=True) as running:
        yield running


async def _start(env: dict[str, str], log: Path, port: int | None = None) -> ServerProcess:
    server = ServerProcess(env, log, port=port)
    await asyncio.to_thread(server.start, 120.0)
    return server


def _sent(upstream: FakeUpstream) -> list[tuple[str, str]]:
    messages = upstream.requests[-1].body["messages"]
    assert validate_history(messages) == []
    return [(m["role"], m["content"]) for m in messages]


async def test_kill_9_during_a_regenerated_turn_leaves_both_branches_valid(
    database_url: str, tmp_path: Path, upstream: FakeUpstream
) -> None:
    models = tmp_path / "models.json"
    models.write_text(
        json.dumps({"providers": {"strict": {"api_base": upstream.base_url, "models": [MODEL]}}})
    )
    env = {
        "PARLEY_DATABASE_URL": database_url,
        "PARLEY_MODELS_FILE": str(models),
        "PARLEY_DEFAULT_MODEL": MODEL,
    }
    upstream.enqueue(Script.text("first answer"), Script.words(400, delay=0.05))
    first = await _start(env, tmp_path / "first.log")
    try:
        async with httpx.AsyncClient(base_url=first.base_url, timeout=30) as client:
            sid = (await client.post("/v1/sessions", json={})).json()["id"]
            asked = await client.post(f"/v1/sessions/{sid}/messages?wait=true", json={"content": "q1"})
            t1 = asked.json()["turn_id"]
            async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
                regenerated = await client.post(f"/v1/sessions/{sid}/turns/{t1}/regenerate")
                assert regenerated.status_code == 202, regenerated.text
                t1b = regenerated.json()["turn_id"]
                await reader.wait_type("text_delta", count=3, timeout=60)
                await asyncio.to_thread(first.kill)
    finally:
        first.kill()

    second = await _start(env, tmp_path / "second.log", port=first.port)
    try:
        async with httpx.AsyncClient(base_url=second.base_url, timeout=30) as client:
            base = f"/v1/sessions/{sid}"
            closed = (await client.get(f"{base}/turns/{t1b}?wait=true&timeout=30")).json()
            assert closed["status"] == "interrupted", closed
            assert (closed["parent_turn_id"], closed["siblings"], closed["sibling_index"]) == (
                None,
                [t1, t1b],
                1,
            )
            partial = closed["final_answer"]
            [turn] = (await client.get(f"{base}/turns")).json()["turns"]
            assert turn["turn_id"] == t1b
            original = (await client.get(f"{base}/turns/{t1}")).json()
            assert (original["status"], original["final_answer"]) == ("completed", "first answer")

            # The regenerated branch goes on: the prompt is its path, the cut answer marked.
            upstream.enqueue(Script.text("second"))
            nxt = await client.post(f"{base}/messages?wait=true", json={"content": "q2"})
            assert nxt.json()["status"] == "completed", nxt.text
            sent = _sent(upstream)
            assert [m[0] for m in sent] == ["user", "assistant", "user"]
            assert sent[0] == ("user", "q1") and sent[2] == ("user", "q2")
            assert (
                partial and sent[1][1].startswith(partial.rstrip()) and sent[1][1].endswith("[interrupted]")
            )

            # And the original branch, one activate away, goes on too.
            activated = await client.post(f"{base}/turns/{t1}/activate")
            assert activated.json()["path_turn_ids"] == [t1]
            upstream.enqueue(Script.text("third"))
            other = await client.post(f"{base}/messages?wait=true", json={"content": "q3"})
            assert other.json()["status"] == "completed", other.text
            assert _sent(upstream) == [("user", "q1"), ("assistant", "first answer"), ("user", "q3")]
    finally:
        second.kill()
