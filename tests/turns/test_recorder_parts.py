"""The recorder's parts on their own (app.turns.recorder): the stop protocol (TurnStop), the status of a
round whose calls run or wait (ToolRequests.settle_status), and the ends over the turn's rows alone, as
recovery uses them (TurnEnds over TurnRows, no TurnRecorder). A whole turn runs through TurnRecorder in
tests/turns/test_execution.py and over HTTP in tests/api, tests/interrupt and tests/tool_requests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.protocol.events import AgentStatus
from app.protocol.schemas import QueuedMessage
from app.settings import DEMO_MODEL
from app.storage import event_log, repository
from app.storage.engine import Database
from app.storage.tables import ChatSessionRow
from app.streaming.log.write_behind import WriteBehind
from app.turns.live import LocalLiveStatus
from app.turns.pending_calls import Waiting
from app.turns.recorder.ends import TurnEnds
from app.turns.recorder.requests import ToolRequests
from app.turns.recorder.round import OpenRound, OpenTool
from app.turns.recorder.rows import TurnRows
from app.turns.recorder.stop import TOOL_INTERRUPTED_BY_RESTART, TOOL_INTERRUPTED_BY_USER, TurnStop

pytestmark = pytest.mark.anyio

SID = "s_recorderparts1"
TURN = "t_000000000001"
T0 = "2026-02-28T06:30:00.000+00:00"


async def idle_task() -> asyncio.Task[None]:
    task = asyncio.create_task(asyncio.sleep(30))
    await asyncio.sleep(0)
    return task


# --- the stop protocol ---------------------------------------------------------------------------------


async def test_a_stop_before_the_task_begins_is_noted_and_taken_when_it_begins() -> None:
    stop = TurnStop()
    stop.task = await idle_task()
    assert stop.request(by_server=False, suspended=False) is True
    assert not stop.task.cancelling()  # a cancel now would skip the task's body: the turn would never close
    assert stop.begin() is True
    stop.task.cancel()


async def test_a_stop_during_a_write_takes_effect_once_the_write_is_done() -> None:
    stop = TurnStop()
    stop.task = await idle_task()
    stop.begin()
    asked: list[tuple[bool, int]] = []

    def write_while_stopped() -> None:
        with stop.atomic():
            task = stop.task
            assert task is not None
            asked.append((stop.request(by_server=False, suspended=False), task.cancelling()))

    with pytest.raises(asyncio.CancelledError):
        write_while_stopped()
    assert asked == [(True, 0)]  # taken, but the task was not cancelled inside the write
    assert (stop.status, stop.tool_result) == ("cancelled", TOOL_INTERRUPTED_BY_USER)
    # Between writes, a stop cancels the task at once.
    again = TurnStop(task=await idle_task())
    again.begin()
    assert again.request(by_server=False, suspended=False) is True
    assert again.task is not None and again.task.cancelling()
    stop.task.cancel()


async def test_a_stop_by_the_server_records_an_interruption_and_detaches_a_turn_that_waits() -> None:
    stop = TurnStop()
    assert stop.request(by_server=True, suspended=True) is True
    assert (stop.status, stop.tool_result, stop.detach) == ("interrupted", TOOL_INTERRUPTED_BY_RESTART, True)
    ending = TurnStop(finishing=True)
    assert ending.request(by_server=True, suspended=False) is False  # it ends by itself
    assert (ending.status, ending.detach) == ("interrupted", False)


# --- the status of a round --------------------------------------------------------------------------


class Published:
    """Stands for the session's publisher: what the parts emit, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[type, dict[str, Any]]] = []

    def emit(self, cls: type, **fields: Any) -> None:
        self.events.append((cls, fields))


def waiting(call_id: str) -> Waiting:
    return Waiting(call_id, "approve_me", {}, "approval", T0, T0)


async def test_a_rounds_status_is_announced_only_when_it_changes() -> None:
    published, live = Published(), LocalLiveStatus()
    rows = TurnRows(None, published, live, SID, TURN, DEMO_MODEL)  # type: ignore[arg-type]
    round_ = OpenRound(tools={"c1": OpenTool("m_1", "slow"), "c2": OpenTool("m_2", "approve_me")})
    requests = ToolRequests(rows, round_, waiting={"c2": waiting("c2")})

    requests.settle_status()
    requests.settle_status()
    del round_.tools["c1"]  # the server tool ended; c2 still waits
    requests.settle_status()
    requests.waiting.clear()
    del round_.tools["c2"]
    requests.settle_status()

    statuses = [(f["status"], f["tool_name"]) for cls, f in published.events if cls is AgentStatus]
    assert statuses == [("tool_calling", "slow"), ("awaiting_input", None), ("thinking", None)]
    assert live.get(SID).agent_status == "thinking" and requests.suspended is False


# --- the ends alone -----------------------------------------------------------------------------------


@pytest.fixture
async def opened(database_url: str) -> AsyncIterator[tuple[Database, TurnRows]]:
    """A turn opened by its rows alone: turn_start and the user's message committed with their events."""
    database = Database(database_url)
    async with database.session() as db:
        db.add(ChatSessionRow(id=SID, model=DEMO_MODEL, tools=[], created_at=T0, updated_at=T0))
        await db.commit()
    writer, live = WriteBehind(database), LocalLiveStatus()
    rows = TurnRows(writer, writer.publisher(SID), live, SID, TURN, DEMO_MODEL)
    message = QueuedMessage(id="m_000000000001", content="hi", sender="User", timestamp=T0, delivery="steer")
    await rows.open([message])
    yield database, rows
    await writer.stop()
    await database.dispose()


async def test_the_ends_alone_close_a_turn_with_its_events_in_order(
    opened: tuple[Database, TurnRows],
) -> None:
    """What recovery and the sweeper use: no recorder, no round, no requests; a stop's end is one
    transaction with agent_status idle, agent_cancelled and turn_done, and a second end does nothing."""
    database, rows = opened
    ends = TurnEnds(rows)
    await ends.end_durably(ends.finish_cancelled)
    await ends.close("completed")  # closed already

    async with database.session() as db:
        stored = [(r.type, r.status) for r in await repository.list_messages(db, SID)]
        logged = [json.loads(e.data) for e in await event_log.events_after(db, SID, 0, 100)]
    assert stored == [("turn_start", None), ("text", None), ("turn_done", "cancelled")]
    assert [e["type"] for e in logged] == [
        "turn_start",
        "user_message",
        "agent_status",
        "agent_status",
        "agent_cancelled",
        "turn_done",
    ]
    assert [e["status"] for e in logged if e["type"] == "agent_status"] == ["thinking", "idle"]
    assert (ends.closed, ends.closed_status, ends.stop.finishing) == (True, "cancelled", True)
    assert rows.live.get(SID).agent_status == "idle"
