"""`?wait=true` over a real socket: a post answered with the ended turn that took it, and the turn route's
wait. Turns that must stay running call the `slow` tool on a gate the test opens (the demo model calls it
for `[call:slow {"gate": ...}]`), so no outcome here depends on how fast the machine is."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from app.settings import Settings
from tests.support.client import new_session
from tests.support.server import LiveServer, live_server
from tests.support.slow_tool import SlowTool, build_registry

pytestmark = pytest.mark.anyio

WAIT = {"wait": "true"}
# Safety nets only: every wait below ends on an event the test causes.
SAFETY = 30.0


@pytest.fixture
def server(settings: Settings, slow_tool: SlowTool) -> Iterator[LiveServer]:
    with live_server(settings, tools=build_registry(slow_tool)) as running:
        yield running


def gated(gate: str) -> str:
    return f"[call:slow {json.dumps({'gate': gate})}]"


async def _until(check: Callable[[], Any], what: str) -> None:
    """Polls a condition the test itself brings about; the time limit only keeps a broken run finite."""
    async with asyncio.timeout(SAFETY):
        while True:
            if await _value(check()):
                return
            await asyncio.sleep(0.02)
    raise AssertionError(what)  # pragma: no cover (the timeout raises first)


async def _value(value: Any) -> Any:
    return await value if asyncio.iscoroutine(value) else value


def _post_waiting(
    client: httpx.AsyncClient, sid: str, content: str, **body: Any
) -> asyncio.Task[httpx.Response]:
    """A `?wait=true` post, answered once its turn ends: a task the test awaits after it acts."""
    return asyncio.create_task(
        client.post(f"/v1/sessions/{sid}/messages", params=WAIT, json={"content": content, **body})
    )


async def _in_the_tool(slow_tool: SlowTool, gate: str) -> None:
    """A turn runs, stopped in the `slow` tool on `gate` until the test opens it."""
    await _until(lambda: gate in slow_tool.started, f"a turn waits in its tool on {gate!r}")


async def _hold(client: httpx.AsyncClient, sid: str, slow_tool: SlowTool, gate: str) -> dict[str, Any]:
    """Posts a message (no wait) whose turn then runs in the tool on `gate`; returns the 202 body."""
    posted = await client.post(f"/v1/sessions/{sid}/messages", json={"content": gated(gate)})
    assert posted.status_code == 202, posted.text
    await _in_the_tool(slow_tool, gate)
    accepted: dict[str, Any] = posted.json()
    return accepted


async def _queued(client: httpx.AsyncClient, sid: str, content: str) -> dict[str, Any]:
    """The waiting message with that content, once the queue shows it."""
    found: list[dict[str, Any]] = []

    async def listed() -> bool:
        queue = (await client.get(f"/v1/sessions/{sid}/queue")).json()["queue"]
        found[:] = [m for m in queue if m["content"] == content]
        return bool(found)

    await _until(listed, f"{content!r} waits in the queue")
    return found[0]


async def _running_turn(client: httpx.AsyncClient, sid: str) -> str:
    turn_id = (await client.get(f"/v1/sessions/{sid}")).json()["running_turn_id"]
    assert turn_id is not None
    return str(turn_id)


def _error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"code", "message", "details", "request_id"}
    assert (error["code"], error["request_id"]) == (code, response.headers["x-request-id"])
    return error


async def test_wait_answers_with_the_ended_turn_and_its_tool_round(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as client:
        sid = await new_session(client)
        posted = await client.post(
            f"/v1/sessions/{sid}/messages", params=WAIT, json={"content": "what time is it?"}
        )
        assert posted.status_code == 200, posted.text
        turn = posted.json()
        read = await client.get(f"/v1/sessions/{sid}/turns/{turn['turn_id']}")
        again = await client.get(f"/v1/sessions/{sid}/turns/{turn['turn_id']}", params=WAIT)
        history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]

    assert "idempotent-replayed" not in posted.headers
    # The turn view's model, read once the turn ended; waiting on an ended turn answers at once with it.
    assert turn == read.json() == again.json()
    assert turn["status"] == "completed" and turn["ended_at"] is not None and turn["error"] is None
    [user] = turn["user_messages"]
    assert (user["content"], user["sender"]) == ("what time is it?", "User")
    assert [n["kind"] for n in turn["nodes"]] == ["llm", "tool", "llm"]
    tool = turn["nodes"][1]
    assert tool["tool_name"] == "current_time" and tool["is_error"] is False and tool["result"]
    assert turn["final_answer"] == turn["nodes"][-1]["content"] != ""
    assert [m["type"] for m in history][-1] == "turn_done"


async def test_a_message_queued_behind_a_running_turn_gets_the_later_turn(
    server: LiveServer, slow_tool: SlowTool
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as client:
        sid = await new_session(client)
        first = await _hold(client, sid, slow_tool, "first")
        waiting = _post_waiting(client, sid, "and then?", delivery="queue", client_message_id="c-1")
        queued = await _queued(client, sid, "and then?")
        assert not waiting.done()
        slow_tool.release("first")
        answered = await waiting
        earlier = (await client.get(f"/v1/sessions/{sid}/turns/{first['turn_id']}")).json()

    assert answered.status_code == 200, answered.text
    turn = answered.json()
    assert turn["turn_id"] != first["turn_id"]
    assert [(m["id"], m["content"], m["client_message_id"]) for m in turn["user_messages"]] == [
        (queued["id"], "and then?", "c-1")
    ]
    assert turn["status"] == "completed" and turn["final_answer"]
    assert earlier["status"] == "completed"


async def test_a_stop_during_the_wait_answers_with_the_cancelled_turn(
    server: LiveServer, slow_tool: SlowTool
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as client:
        sid = await new_session(client)
        waiting = _post_waiting(client, sid, gated("never"))
        await _in_the_tool(slow_tool, "never")
        stopped = await client.post(f"/v1/sessions/{sid}/cancel")
        answered = await waiting

    assert stopped.status_code == 202, stopped.text
    assert answered.status_code == 200, answered.text
    turn = answered.json()
    assert (turn["turn_id"], turn["status"]) == (stopped.json()["turn_id"], "cancelled")
    assert turn["nodes"][-1]["kind"] == "tool" and turn["nodes"][-1]["interrupted"] is True
    assert slow_tool.cancelled == ["never"]


async def test_past_its_limit_a_wait_is_a_504_with_the_turn_id_and_the_turn_goes_on(
    server: LiveServer, slow_tool: SlowTool
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as client:
        sid = await new_session(client)
        # The gate stays shut until the 504 is in: the turn cannot end before it.
        late = await client.post(
            f"/v1/sessions/{sid}/messages", params={**WAIT, "timeout": "0.2"}, json={"content": gated("late")}
        )
        error = _error(late, 504, "wait_timeout")
        turn_id, message_id = error["details"]["turn_id"], error["details"]["message_id"]
        assert error["details"]["timeout"] == 0.2
        session = (await client.get(f"/v1/sessions/{sid}")).json()
        running = (await client.get(f"/v1/sessions/{sid}/turns/{turn_id}")).json()
        again = await client.get(f"/v1/sessions/{sid}/turns/{turn_id}", params={**WAIT, "timeout": "0.2"})
        waiting = asyncio.create_task(client.get(f"/v1/sessions/{sid}/turns/{turn_id}", params=WAIT))
        slow_tool.release("late")
        answered = await waiting

    assert session["running_turn_id"] == turn_id and running["status"] == "running"
    assert [m["id"] for m in running["user_messages"]] == [message_id]
    assert _error(again, 504, "wait_timeout")["details"] == {
        "turn_id": turn_id,
        "message_id": None,
        "timeout": 0.2,
    }
    assert answered.status_code == 200, answered.text
    turn = answered.json()
    assert (turn["turn_id"], turn["status"]) == (turn_id, "completed")
    assert slow_tool.finished == ["late"] and slow_tool.cancelled == []


@pytest.fixture
def short_waits(settings: Settings, slow_tool: SlowTool) -> Iterator[LiveServer]:
    """PARLEY_WAIT_TIMEOUT=0.2: no wait lasts longer, whatever `timeout` it asks for."""
    tuned = settings.model_copy(update={"wait_timeout": 0.2})
    with live_server(tuned, tools=build_registry(slow_tool)) as running:
        yield running


async def test_the_configured_limit_bounds_a_wait_and_caps_a_longer_timeout(
    short_waits: LiveServer, slow_tool: SlowTool
) -> None:
    async with httpx.AsyncClient(base_url=short_waits.base_url, timeout=SAFETY) as client:
        sid = await new_session(client)
        # No `timeout`: the configured limit applies. The gate stays shut: the turn cannot end first.
        unbounded = await client.post(
            f"/v1/sessions/{sid}/messages", params=WAIT, json={"content": gated("cap")}
        )
        error = _error(unbounded, 504, "wait_timeout")
        turn_id = error["details"]["turn_id"]
        # A longer `timeout` is capped (uncapped, this wait would outlast the client's SAFETY timeout).
        capped = await client.get(f"/v1/sessions/{sid}/turns/{turn_id}", params={**WAIT, "timeout": "60"})
        slow_tool.release("cap")

    assert turn_id is not None and error["details"]["timeout"] == 0.2
    assert _error(capped, 504, "wait_timeout")["details"] == {
        "turn_id": turn_id,
        "message_id": None,
        "timeout": 0.2,
    }


async def test_a_queued_message_past_its_limit_has_no_turn_yet_and_a_retry_waits_for_its_turn(
    server: LiveServer, slow_tool: SlowTool
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as client:
        sid = await new_session(client)
        first = await _hold(client, sid, slow_tool, "hold")
        body = {"content": "after that", "delivery": "queue"}
        key = {"Idempotency-Key": "wait-retry-1"}
        late = await client.post(
            f"/v1/sessions/{sid}/messages", params={**WAIT, "timeout": "0.1"}, json=body, headers=key
        )
        queue = (await client.get(f"/v1/sessions/{sid}/queue")).json()["queue"]
        slow_tool.release("hold")
        retried = await client.post(f"/v1/sessions/{sid}/messages", params=WAIT, json=body, headers=key)
        history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]

    error = _error(late, 504, "wait_timeout")
    message_id = error["details"]["message_id"]
    assert error["details"]["turn_id"] is None
    assert [m["id"] for m in queue] == [message_id]
    assert retried.status_code == 200, retried.text
    assert retried.headers["idempotent-replayed"] == "true"
    turn = retried.json()
    assert turn["turn_id"] != first["turn_id"] and turn["status"] == "completed"
    assert [m["id"] for m in turn["user_messages"]] == [message_id]
    # The retry waited for the stored message: it did not post it again.
    assert [m["content"] for m in history if m.get("role") == "user"] == [gated("hold"), "after that"]


async def test_an_idempotent_retry_with_wait_waits_for_the_first_posts_turn(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as client:
        sid = await new_session(client)
        key = {"Idempotency-Key": "wait-retry-2"}
        body = {"content": "what is 2+3*4?"}
        posted = await client.post(f"/v1/sessions/{sid}/messages", json=body, headers=key)
        retried = await client.post(f"/v1/sessions/{sid}/messages", params=WAIT, json=body, headers=key)
        history = (await client.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]

    assert posted.status_code == 202, posted.text
    assert retried.status_code == 200 and retried.headers["idempotent-replayed"] == "true"
    turn = retried.json()
    assert turn["turn_id"] == posted.json()["turn_id"] and turn["status"] == "completed"
    assert [m["id"] for m in turn["user_messages"]] == [posted.json()["id"]]
    assert [m["content"] for m in history if m.get("role") == "user"] == ["what is 2+3*4?"]


async def test_a_waiter_that_disconnects_stops_waiting_and_the_turn_goes_on(
    server: LiveServer, slow_tool: SlowTool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="app.errors")
    async with (
        httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as client,
        httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as leaving,
    ):
        sid = await new_session(client)
        waiting = _post_waiting(leaving, sid, gated("gone"))
        await _in_the_tool(slow_tool, "gone")
        turn_id = await _running_turn(client, sid)
        waiting.cancel()  # closes the connection: what a script's Ctrl-C does
        await asyncio.gather(waiting, return_exceptions=True)
        await _until(
            lambda: any("499 client_closed_request" in r.getMessage() for r in caplog.records),
            "the server stopped the wait",
        )
        still = (await client.get(f"/v1/sessions/{sid}")).json()
        slow_tool.release("gone")
        ended = await client.get(f"/v1/sessions/{sid}/turns/{turn_id}", params=WAIT)

    assert still["running_turn_id"] == turn_id and slow_tool.cancelled == []
    assert ended.status_code == 200 and ended.json()["status"] == "completed"


async def test_a_message_withdrawn_while_its_poster_waits_is_a_409(
    server: LiveServer, slow_tool: SlowTool
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as client:
        sid = await new_session(client)
        await _hold(client, sid, slow_tool, "busy")
        waiting = _post_waiting(client, sid, "never mind", delivery="queue")
        queued = await _queued(client, sid, "never mind")
        withdrawn = await client.delete(f"/v1/sessions/{sid}/queue/{queued['id']}")
        answered = await waiting
        slow_tool.release("busy")

    assert withdrawn.status_code == 200, withdrawn.text
    assert _error(answered, 409, "withdrawn")["details"] == {"message_id": queued["id"]}


async def test_at_shutdown_a_waiter_gets_the_interrupted_turn_and_a_queued_ones_a_503(
    server: LiveServer, slow_tool: SlowTool
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as client:
        sid = await new_session(client)
        running = _post_waiting(client, sid, gated("down"))
        await _in_the_tool(slow_tool, "down")
        behind = _post_waiting(client, sid, "later", delivery="queue")
        queued = await _queued(client, sid, "later")
        await asyncio.to_thread(server.drain)  # what SIGTERM starts
        interrupted, refused = await running, await behind

    assert interrupted.status_code == 200, interrupted.text
    assert interrupted.json()["status"] == "interrupted"
    # The message stays in the line: the next start of the server takes it.
    assert _error(refused, 503, "unavailable")["details"] == {"message_id": queued["id"]}


async def test_waiting_on_an_unknown_turn_is_a_404(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as client:
        sid = await new_session(client)
        response = await client.get(f"/v1/sessions/{sid}/turns/t_000000000000", params=WAIT)
    _error(response, 404, "not_found")


async def test_deleting_the_session_ends_its_waits_with_a_404(
    server: LiveServer, slow_tool: SlowTool
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as client:
        sid = await new_session(client)
        running = _post_waiting(client, sid, gated("deleted"))
        await _in_the_tool(slow_tool, "deleted")
        behind = _post_waiting(client, sid, "gone", delivery="queue")
        await _queued(client, sid, "gone")
        deleted = await client.delete(f"/v1/sessions/{sid}")
        answers = [await running, await behind]

    assert deleted.status_code == 204, deleted.text
    for answer in answers:
        _error(answer, 404, "not_found")
