"""app.storage.pending against a real, migrated SQLite file, and the suspended round app.turns.suspended
reads back from it after a restart."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from app.storage import pending
from app.storage.engine import Database
from app.storage.tables import ChatMessageRow, PendingToolRequestRow
from app.tools.registry import build_default_registry
from app.turns.recorder.round import OpenRound
from app.turns.recorder.stop import TOOL_INTERRUPTED_BY_RESTART
from app.turns.suspended import edit_problem, last_round, resumed_round, turn_client_tools
from tests.support.rows import T0, add_sessions

pytestmark = pytest.mark.anyio


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    db = Database(database_url)
    await add_sessions(db, "s_a", "s_b")
    yield db
    await db.dispose()


def request(
    call_id: str, *, turn_id: str = "t_1", session_id: str = "s_a", state: str = "pending", **fields: object
) -> PendingToolRequestRow:
    return PendingToolRequestRow(
        session_id=session_id,
        turn_id=turn_id,
        tool_call_id=call_id,
        message_id=f"m_{call_id}",
        kind=str(fields.pop("kind", "approval")),
        tool_name="calculate",
        arguments={"expression": "1"},
        requested_at=T0,
        expires_at="2099-01-01T00:00:00+00:00",
        state=state,
        **fields,  # type: ignore[arg-type]
    )


def tool_row(call_id: str, result: str | None = None, turn_id: str = "t_1") -> ChatMessageRow:
    return ChatMessageRow(
        id=f"m_{call_id}",
        session_id="s_a",
        turn_id=turn_id,
        type="tool_group",
        role="assistant",
        timestamp=T0,
        response_id="r_1",
        tool_call_id=call_id,
        tool_name="calculate",
        arguments={"expression": "1"},
        result=result,
    )


async def test_requests_round_trip_and_the_newest_of_a_call_id_wins(database: Database) -> None:
    async with database.session() as db:
        await pending.insert(
            db, [request("c1", turn_id="t_0", state="answered"), request("c1"), request("c2")]
        )
        await pending.insert(db, [request("c3", session_id="s_b", turn_id="t_9")])
        await pending.update_request(db, "t_1", "c2", {"state": "expired", "decision": "expired"})
        await db.commit()
        assert [r.tool_call_id for r in await pending.waiting_in_session(db, "s_a")] == ["c1"]
        latest = await pending.latest_for_calls(db, "s_a", ["c1", "c3"])
    assert (latest["c1"].turn_id, "c3" in latest) == ("t_1", False)  # another session's call is not found


async def test_suspended_turns_are_open_turns_that_still_wait_or_hold_an_unstarted_approval(
    database: Database,
) -> None:
    async with database.session() as db:
        await pending.insert(
            db,
            [
                request("w", turn_id="t_wait"),
                request("a", turn_id="t_approved", state="answered", decision="approve"),
                request("r", turn_id="t_ran", state="running", decision="approve"),
                request("x", turn_id="t_closed"),
            ],
        )
        db.add(
            ChatMessageRow(id="m_done", session_id="s_a", turn_id="t_closed", type="turn_done", timestamp=T0)
        )
        await db.commit()
        assert sorted(await pending.suspended_turns(db)) == ["t_approved", "t_wait"]


async def test_a_resumed_round_from_rows(database: Database) -> None:
    rows = [
        tool_row("done", result="1"),
        tool_row("wait"),
        tool_row("ok"),
        tool_row("ran"),
        tool_row("server"),
    ]
    async with database.session() as db:
        db.add_all(rows)
        await pending.insert(
            db,
            [
                request("wait"),
                request("ok", state="answered", decision="edit"),
                request("ran", state="running", decision="approve"),
            ],
        )
        await db.commit()
        plan = await resumed_round(db, "t_1", rows)
    assert [c.id for c in plan.calls] == ["done", "wait", "ok", "ran", "server"]
    assert plan.outcomes["done"].content == "1"
    assert [w.call_id for w in plan.waiting] == ["wait"]
    assert list(plan.approved) == ["ok"]
    assert {k: v.content for k, v in plan.interrupted.items()} == {
        "ran": TOOL_INTERRUPTED_BY_RESTART,
        "server": TOOL_INTERRUPTED_BY_RESTART,
    }
    adopted = OpenRound()
    adopted.adopt(last_round(rows, "t_1"))
    assert sorted(adopted.tools) == ["ok", "ran", "server", "wait"]


def test_edited_arguments_are_checked_against_the_tool() -> None:
    tools = build_default_registry()
    assert edit_problem(tools, "calculate", {"expression": "1+1"}) is None
    assert "expression" in (edit_problem(tools, "calculate", {"expression": 5}) or "")
    assert edit_problem(tools, "nope", {}) == "unknown tool 'nope'"


def test_a_turn_offers_the_session_client_tools_then_its_messages_own() -> None:
    from app.storage.tables import ChatSessionRow

    session = ChatSessionRow(
        id="s", model="m", tools=[], created_at=T0, updated_at=T0, client_tools=[{"name": "a"}]
    )
    user = ChatMessageRow(
        id="m_u",
        session_id="s",
        turn_id="t",
        type="text",
        role="user",
        timestamp=T0,
        client_tools=[{"name": "a", "description": "dup"}, {"name": "b"}],
    )
    other = ChatMessageRow(
        id="m_o",
        session_id="s",
        turn_id="t_other",
        type="text",
        role="user",
        timestamp=T0,
        client_tools=[{"name": "c"}],
    )
    assert [t["name"] for t in turn_client_tools(session, [user, other], "t")] == ["a", "b"]


async def test_closing_a_turn_interrupts_only_what_still_waits_or_never_started(database: Database) -> None:
    async with database.session() as db:
        await pending.insert(
            db,
            [
                request("w"),
                request("approved", state="answered", decision="approve"),
                request("answered", state="answered", decision="answered", kind="client"),
                request("ran", state="running", decision="approve"),
            ],
        )
        await pending.close_turn_requests(db, "t_1", T0)
        await db.commit()
        states = {r.tool_call_id: r.state for r in await pending.of_turn(db, "t_1")}
    assert states == {"w": "interrupted", "approved": "interrupted", "answered": "answered", "ran": "running"}
