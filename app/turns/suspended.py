"""What a turn that waits outside the service is built from: its client tools, the check of edited
arguments, and, after a restart, its suspended round read back from the rows (turns.rounds.ResumedRound).

A call of the suspended round keeps its result if it has one; waits again, with its original expiry, if
its request is still pending; runs if it was approved and had not started; and gets the restart's
interrupted result if it was running when the process died (a server tool, or an approved one): it is
never run a second time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from sqlmodel.ext.asyncio.session import AsyncSession

from app.storage import pending
from app.storage.tables import ChatMessageRow, ChatSessionRow
from app.tools.registry import Tool, ToolOutcome, ToolRegistry
from app.turns.agent_events import CallRequest, arguments_text
from app.turns.pending_calls import Kind, Waiting
from app.turns.recorder.stop import TOOL_INTERRUPTED_BY_RESTART
from app.turns.rounds import ResumedRound


def client_tool_schema(tool: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool["name"],
            "description": tool.get("description", ""),
            "parameters": tool.get("parameters") or {"type": "object", "properties": {}},
        },
    }


def turn_client_tools(
    session: ChatSessionRow, rows: Sequence[ChatMessageRow], turn_id: str
) -> list[dict[str, Any]]:
    """The session's client tools, then those the turn's own messages brought (a name once)."""
    tools = {t["name"]: t for t in session.client_tools}
    for row in rows:
        if row.turn_id == turn_id and row.type == "text" and row.role == "user" and row.client_tools:
            for tool in row.client_tools:
                tools.setdefault(tool["name"], tool)
    return list(tools.values())


def edit_problem(tools: ToolRegistry, name: str, arguments: dict[str, Any]) -> str | None:
    """None when `arguments` fit the tool's schema, else what is wrong (for the 422). MCP and HTTP tools
    are checked against their JSON schema, built-ins against their parameters model."""
    tool = tools.get(name)
    if tool is None:
        external = tools.lookup(name)
        if external is None or isinstance(external, Tool):
            return f"unknown tool {name!r}"
        return external.check(arguments)
    try:
        tool.params_model.model_validate(arguments)
    except ValidationError as exc:
        return "; ".join(
            f"{'.'.join(str(part) for part in err['loc']) or '(arguments)'}: {err['msg']}"
            for err in exc.errors()
        )
    return None


def last_round(rows: Sequence[ChatMessageRow], turn_id: str) -> list[ChatMessageRow]:
    """The tool_group rows of the turn's last model response."""
    tool_rows = [r for r in rows if r.turn_id == turn_id and r.type == "tool_group"]
    last = tool_rows[-1].response_id if tool_rows else None
    return [r for r in tool_rows if r.response_id == last]


async def resumed_round(db: AsyncSession, turn_id: str, rows: Sequence[ChatMessageRow]) -> ResumedRound:
    round_rows = last_round(rows, turn_id)
    requests = {p.tool_call_id: p for p in await pending.of_turn(db, turn_id)}
    interrupted = ToolOutcome(TOOL_INTERRUPTED_BY_RESTART, is_error=True)
    plan = ResumedRound(
        calls=[
            CallRequest(r.tool_call_id or "", r.tool_name or "", arguments_text(r.arguments))
            for r in round_rows
        ]
    )
    for row in round_rows:
        call_id = row.tool_call_id or ""
        request = requests.get(call_id)
        if row.result is not None:
            plan.outcomes[call_id] = ToolOutcome(row.result, bool(row.is_error))
        elif request is not None and request.state == pending.WAITING:
            kind: Kind = "client" if request.kind == "client" else "approval"
            plan.waiting.append(
                Waiting(
                    call_id,
                    request.tool_name,
                    request.arguments,
                    kind,
                    request.requested_at,
                    request.expires_at,
                )
            )
        elif request is not None and request.state == "answered" and request.decision in ("approve", "edit"):
            plan.approved[call_id] = arguments_text(row.arguments)
        else:
            plan.interrupted[call_id] = interrupted
    return plan
