"""Context compaction across real replica processes on PostgreSQL and Redis (docs/context.md): a summary is
written once, by the turn's owner, under the turn's lease.

How each test proves its point: the summary rows and events are read from the database the replicas
share; the strict fake upstream (a small window, answering summary requests by their content) holds the
owner's summary call while the owner is killed, or frozen past its lease (then woken once the survivor
took the turn over and the summary was sent: it stops at its lost lease, and its writes are fenced); the
survivor's next turn summarises again, and the session ends with one summary row and one
context_compacted event, both of the survivor's turn.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.api.test_context import SUMMARY, WINDOW, Conversation
from tests.fakes.upstream import FakeUpstream, RecordedRequest, Script, validate_history
from tests.replicas.conftest import LEASE_SECONDS, Replicas, clients, rows, until
from tests.replicas.test_ownership import history, new_session, post, turn_status
from tests.support.postgres import ScratchDatabase

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

MODEL = "openai/small-window"
LONG = "tell me more about it " * 60


@pytest.fixture
def conversation() -> Conversation:
    return Conversation()


@pytest.fixture
def upstream(conversation: Conversation) -> Iterator[FakeUpstream]:
    """The replicas' model (overrides the cluster's): strict, with a window, answering by content."""
    with FakeUpstream(strict=True, window=WINDOW, responder=conversation) as running:
        yield running


def summarising(request: RecordedRequest) -> bool:
    return "[summary request]" in json.dumps(request.body)


def summaries(pg: ScratchDatabase, sid: str) -> list[dict[str, Any]]:
    names = ["id", "through_turn_id", "turn_ids", "turn_id", "content"]
    found = rows(
        pg, f"SELECT {', '.join(names)} FROM context_summaries WHERE session_id = %s ORDER BY position", sid
    )
    return [dict(zip(names, row, strict=True)) for row in found]


def compacted_events(pg: ScratchDatabase, sid: str) -> list[dict[str, Any]]:
    found = rows(
        pg, "SELECT data FROM events WHERE session_id = %s AND type = 'context_compacted' ORDER BY seq", sid
    )
    return [json.loads(data) if isinstance(data, str) else data for (data,) in found]


@pytest.mark.parametrize("how", ["killed", "frozen"])
async def test_an_owner_lost_during_its_summary_writes_none_and_the_survivor_writes_it_once(
    replicas: Replicas,
    pg: ScratchDatabase,
    upstream: FakeUpstream,
    conversation: Conversation,
    tmp_path: Path,
    how: str,
) -> None:
    """The owner of a turn waiting on its summary call is killed (kill -9), or frozen (SIGSTOP) past its
    lease and woken once the survivor took the turn over and the summary was sent to it: no summary and
    no context_compacted of that turn is stored; the message acknowledged meanwhile is answered by the
    survivor, whose turn writes the summary once."""
    models = tmp_path / "small.json"
    providers = {"fake": {"api_base": upstream.base_url, "models": {MODEL: {"context_window": WINDOW}}}}
    models.write_text(json.dumps({"providers": providers}))
    owner, survivor = await replicas(2, PARLEY_MODELS_FILE=str(models), PARLEY_DEFAULT_MODEL=MODEL)
    # The owner's summary comes a second after it was asked for: by then the owner is gone or frozen
    # (a frozen one reads it only once it runs again, after the takeover).
    conversation.summary_script = Script.text(SUMMARY, hang_before_headers=1.0)
    async with clients(owner, survivor) as (a, b):
        sid = await new_session(a, context={"keep_turns": 1})
        turn_id = ""
        for n in range(12):
            posted = await post(a, sid, f"{n} {LONG}")
            turn_id = str(posted["turn_id"])
            ended = await until(partial(_ended_or_summarising, pg, turn_id, upstream), seconds=60)
            if ended == "summarising":
                break
            assert ended == "completed"
        if how == "killed":
            await asyncio.to_thread(owner.kill)
        else:
            owner.pause()
        held = await upstream.await_request(summarising, within=5)
        waiting = await post(b, sid, "and now?")
        assert waiting["queued"] is True and waiting["turn_id"] is None  # the lease is the owner's
        status = await until(lambda: _status(pg, turn_id), seconds=LEASE_SECONDS * 5)
        assert status == "interrupted"
        assert (summaries(pg, sid), compacted_events(pg, sid)) == ([], [])
        if how == "frozen":
            await until(lambda: _true(held.done), seconds=10)
            conversation.summary_script = None
            owner.resume()
            await until(lambda: _logged(owner, "lost its lease"), seconds=LEASE_SECONDS * 3)
        else:
            conversation.summary_script = None
        # The survivor answers the waiting message; its turn summarises.
        await until(lambda: _answered(pg, sid, waiting["id"]), seconds=60)
        # Long enough for a frozen owner's write of its summary, had the lease's fence let it through.
        await asyncio.sleep(LEASE_SECONDS)
        context = (await b.get(f"/v1/sessions/{sid}/context")).json()

    next_turn = str(rows(pg, "SELECT turn_id FROM chat_messages WHERE id = %s", waiting["id"])[0][0])
    [written] = summaries(pg, sid)
    assert (written["turn_id"], written["content"]) == (next_turn, SUMMARY)
    [event] = compacted_events(pg, sid)
    assert (event["turn_id"], event["summary_id"], event["summary_written"]) == (
        next_turn,
        written["id"],
        True,
    )
    assert context["summary"]["id"] == written["id"]
    # Two summary calls (the lost owner's and the survivor's); every request valid within the window.
    assert len([r for r in upstream.requests if summarising(r)]) == 2
    for request in upstream.requests:
        assert request.problems == [], request.problems
        assert validate_history(request.body["messages"]) == []
    users = [m for m in history(pg, sid) if m["type"] == "text" and m["role"] == "user"]
    assert len(users) == n + 2 and users[-1]["id"] == waiting["id"]


async def _ended_or_summarising(pg: ScratchDatabase, turn_id: str, upstream: FakeUpstream) -> str | None:
    if any(summarising(r) for r in upstream.requests):
        return "summarising"
    return turn_status(pg, turn_id)


async def _status(pg: ScratchDatabase, turn_id: str) -> str | None:
    return turn_status(pg, turn_id)


async def _answered(pg: ScratchDatabase, sid: str, message_id: str) -> bool:
    found = rows(pg, "SELECT turn_id FROM chat_messages WHERE id = %s", message_id)
    return bool(found) and turn_status(pg, str(found[0][0])) == "completed"


async def _logged(server: Any, text: str) -> bool:
    return text in server.log()


async def _true(value: bool) -> bool:
    return value
