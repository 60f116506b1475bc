"""The turn view's grouping rules (app.chat.views.build_turns), on chat_messages rows. The turn view over a
real socket: tests/contract/test_turns.py."""

from __future__ import annotations

from typing import Any

from app.chat.views import build_turns
from app.protocol.turns import LlmNode, ToolNode
from app.storage.tables import ChatMessageRow
from app.turns.recorder.stop import TOOL_INTERRUPTED_BY_USER


def _row(position: int, turn_id: str, type: str, **values: Any) -> ChatMessageRow:
    return ChatMessageRow(
        position=position,
        id=f"m_{position:010x}",
        session_id="s_1",
        turn_id=turn_id,
        type=type,
        timestamp=f"2026-01-01T00:00:{position:02d}.000+00:00",
        **values,
    )


def test_a_failed_turn_keeps_its_error_and_its_cut_tool_call() -> None:
    rows = [
        _row(1, "t_a", "turn_start"),
        _row(2, "t_a", "text", role="user", content="one", sender="Ann"),
        _row(3, "t_a", "text", role="user", content="two", sender="Bob"),
        _row(4, "t_a", "text", role="assistant", content="Let me look.", model="m", duration_ms=5),
        _row(5, "t_a", "tool_group", role="assistant", model="m", tool_call_id="c1", tool_name="slow",
             arguments={}, result=TOOL_INTERRUPTED_BY_USER, is_error=True, interrupted=True),
        _row(6, "t_a", "error", role="assistant", content="The model failed.", code="provider_error"),
        _row(7, "t_a", "turn_done", duration_seconds=1.5, status="failed"),
        _row(8, "t_b", "turn_start"),
        _row(9, "t_b", "text", role="user", content="three", sender="User"),
    ]  # fmt: skip

    failed, running = build_turns(rows)

    assert [m.content for m in failed.user_messages] == ["one", "two"]
    assert (failed.status, failed.duration_seconds, failed.ended_at) == ("failed", 1.5, rows[6].timestamp)
    assert failed.error is not None and (failed.error.code, failed.error.id) == ("provider_error", rows[5].id)
    llm, tool = failed.nodes
    assert isinstance(llm, LlmNode) and isinstance(tool, ToolNode)
    assert (tool.interrupted, tool.is_error, tool.duration_ms) == (True, True, None)
    assert failed.final_answer == "Let me look."
    assert (running.status, running.ended_at, running.nodes, running.final_answer) == (
        "running",
        None,
        [],
        None,
    )
    assert running.started_at == rows[7].timestamp


def test_a_tool_error_is_not_an_interruption() -> None:
    rows = [
        _row(1, "t_a", "turn_start"),
        _row(2, "t_a", "tool_group", role="assistant", model="m", tool_call_id="c1", tool_name="calculate",
             arguments={"expression": "1/0"}, result="division by zero", is_error=True, duration_ms=1),
        _row(3, "t_a", "turn_done", duration_seconds=0.1, status="completed"),
    ]  # fmt: skip

    [turn] = build_turns(rows)

    [tool] = turn.nodes
    assert isinstance(tool, ToolNode) and (tool.is_error, tool.interrupted) == (True, False)
    assert turn.final_answer is None
