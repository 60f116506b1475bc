"""The use-case rules of client tools and approvals: declarations (app.protocol.tool_requests), their
checks against a session's tools (app.chat.tool_rules), and answers to calls that no longer wait, read
from their rows (app.chat.tool_answers). The routes (app.api.tool_requests) are exercised end to end in
tests/tool_requests/."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from app.api.tool_requests import router
from app.chat.errors import UnknownTool
from app.chat.tool_answers import _replay
from app.chat.tool_rules import ToolNameClash, check_approval, check_client_tools
from app.protocol.schemas import SessionCreate
from app.protocol.tool_requests import ApprovalsIn, ClientTool, ToolResultsIn, approval_names
from app.storage.tables import PendingToolRequestRow
from app.tools.registry import build_default_registry
from app.turns.pending_calls import AnswerConflict, AnswerExpired


def test_the_routes() -> None:
    assert sorted(r.path for r in router.routes) == [  # type: ignore[attr-defined]
        "/v1/sessions/{session_id}/approvals",
        "/v1/sessions/{session_id}/pending",
        "/v1/sessions/{session_id}/tool_results",
    ]


@pytest.mark.parametrize(
    "tool",
    [
        {"name": "has space"},
        {"name": "x" * 65},
        {"name": "ok", "parameters": {"type": "array"}},
        {"name": "ok", "extra": 1},
    ],
)
def test_a_client_tool_that_cannot_be_offered_is_refused(tool: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ClientTool.model_validate(tool)


def test_declarations() -> None:
    assert ClientTool(name="loc").parameters == {"type": "object", "properties": {}}
    with pytest.raises(ValidationError):
        SessionCreate.model_validate({"client_tools": [{"name": "a"}, {"name": "a"}]})
    assert approval_names(["a", "b", "a"]) == ["a", "b"]
    assert approval_names({"a": "always", "b": "never"}) == ["a"]
    assert approval_names(None) == []
    with pytest.raises(ValidationError):  # output and error, or neither
        ToolResultsIn.model_validate({"results": [{"tool_call_id": "c", "output": 1, "error": "e"}]})
    with pytest.raises(ValidationError):
        ToolResultsIn.model_validate({"results": [{"tool_call_id": "c"}]})
    with pytest.raises(ValidationError):  # arguments only with edit
        ApprovalsIn.model_validate(
            {"decisions": [{"tool_call_id": "c", "decision": "approve", "arguments": {}}]}
        )
    with pytest.raises(ValidationError):
        ApprovalsIn.model_validate({"decisions": [{"tool_call_id": "c", "decision": "edit"}]})


def test_tool_rules() -> None:
    check_client_tools(["calculate"], [ClientTool(name="loc")])
    with pytest.raises(ToolNameClash):
        check_client_tools(["calculate"], [ClientTool(name="calculate")])
    registry = build_default_registry()
    check_approval(["*", "calculate"], ["calculate"], registry)
    with pytest.raises(UnknownTool):
        check_approval(["slow"], ["calculate"], registry)


def _row(state: str, answer: Any, decision: str | None = None) -> PendingToolRequestRow:
    return PendingToolRequestRow(
        session_id="s",
        turn_id="t",
        tool_call_id="c",
        message_id="m",
        kind="client",
        tool_name="loc",
        requested_at="x",
        expires_at="y",
        state=state,
        answer=answer,
        decision=decision,
    )


def test_an_answer_to_a_call_no_longer_waiting_is_read_from_its_row() -> None:
    given = {"tool_call_id": "c", "output": "Paris"}
    replay = _replay(_row("answered", given, "answered"), given)
    assert (replay.replayed, replay.resolution) == (True, "answered")
    with pytest.raises(AnswerConflict):
        _replay(_row("answered", given, "answered"), {"tool_call_id": "c", "output": "Lyon"})
    with pytest.raises(AnswerConflict):
        _replay(_row("interrupted", None, "interrupted"), given)
    with pytest.raises(AnswerExpired):
        _replay(_row("expired", None, "expired"), given)
