"""Answers to calls that wait outside the service: a client tool's results (POST .../tool_results), a
person's decisions (POST .../approvals), and what waits (GET .../pending).

An answer to a call that still waits goes to the running turn, which checks it against what waits and
commits it before the reply. An answer to a call already resolved is answered from its row: the same
answer again is a replay, another one `answer_conflict`, one after expiry `expired`; a call the session
never waited for is `no_pending_call`. Answers racing for one call get the same: the turn takes the first,
and the others are answered from what it committed (the turn refuses them once it no longer waits, and the
rows say).
"""

from __future__ import annotations

from typing import Any

from app.chat.sessions import Sessions
from app.protocol.tool_requests import (
    ApprovalsIn,
    PendingList,
    PendingRequest,
    Resolution,
    ResolutionResult,
    ToolResultsIn,
)
from app.storage import pending
from app.storage.engine import Database
from app.storage.tables import PendingToolRequestRow
from app.turns.control import TurnControl
from app.turns.pending_calls import (
    DECISIONS,
    AnswerConflict,
    AnswerExpired,
    AnswerRefused,
    Kind,
    NoPendingCall,
)


class ToolAnswers:
    def __init__(self, database: Database, sessions: Sessions, turns: TurnControl) -> None:
        self._database = database
        self._sessions = sessions
        self._turns = turns

    async def pending(self, principal: str, session_id: str) -> PendingList:
        await self._sessions.owned(principal, session_id)
        async with self._database.read() as db:
            rows = await pending.waiting_in_session(db, session_id)
        return PendingList(pending=[_pending(row) for row in rows])

    async def tool_results(self, principal: str, session_id: str, body: ToolResultsIn) -> ResolutionResult:
        items = [item.model_dump(mode="json", exclude_none=True) for item in body.results]
        return await self._answer(principal, session_id, "client", items)

    async def approvals(self, principal: str, session_id: str, body: ApprovalsIn) -> ResolutionResult:
        items = [item.model_dump(mode="json", exclude_none=True) for item in body.decisions]
        return await self._answer(principal, session_id, "approval", items)

    async def _answer(
        self, principal: str, session_id: str, kind: Kind, items: list[dict[str, Any]]
    ) -> ResolutionResult:
        await self._sessions.owned(principal, session_id)
        ids = [item["tool_call_id"] for item in items]
        rows = await self._requests(session_id, kind, ids)
        if any(row.state == pending.WAITING for row in rows.values()):
            resolved = await self._to_turn(session_id, kind, items)
        else:
            resolved = [_replay(rows[item["tool_call_id"]], item) for item in items]
        return ResolutionResult(turn_id=rows[ids[0]].turn_id, resolved=resolved)

    async def _requests(
        self, session_id: str, kind: Kind, ids: list[str]
    ) -> dict[str, PendingToolRequestRow]:
        async with self._database.read() as db:
            rows = await pending.latest_for_calls(db, session_id, ids)
        for call_id in ids:
            row = rows.get(call_id)
            if row is None or row.kind != kind:
                raise NoPendingCall(
                    f"No {'client tool call' if kind == 'client' else 'approval request'} waits for "
                    f"tool call {call_id!r} in this session.",
                    details={"tool_call_id": call_id},
                )
        return rows

    async def _to_turn(self, session_id: str, kind: Kind, items: list[dict[str, Any]]) -> list[Resolution]:
        """The answer, to the turn that waits for it. The turn may have taken another answer (the same
        one racing this, or a different one) or its expiry since the rows were read, or ended: it then
        no longer waits, and what it committed decides, as for an answer that comes later."""
        try:
            return await self._turns.answer(session_id, kind, items)
        except AnswerRefused as refused:
            if refused.code != NoPendingCall.code:
                raise
            rows = await self._requests(session_id, kind, [item["tool_call_id"] for item in items])
            if any(row.state == pending.WAITING for row in rows.values()):
                raise  # it still waits, but no turn takes its answer here
            return [_replay(rows[item["tool_call_id"]], item) for item in items]


def _replay(row: PendingToolRequestRow, item: dict[str, Any]) -> Resolution:
    """An answer to a call no longer waiting: the same answer again is a replay."""
    if row.state == "expired":
        raise AnswerExpired(
            f"The wait for tool call {row.tool_call_id!r} expired; the model has read a timeout error.",
            details={"tool_call_id": row.tool_call_id, "expired_at": row.answered_at},
        )
    if row.state == "interrupted" or row.answer != item:
        raise AnswerConflict(
            f"Tool call {row.tool_call_id!r} was "
            + ("interrupted" if row.state == "interrupted" else "answered differently")
            + " before.",
            details={"tool_call_id": row.tool_call_id, "answer": row.answer, "state": row.state},
        )
    return Resolution(tool_call_id=row.tool_call_id, resolution=row.decision or "answered", replayed=True)


def _pending(row: PendingToolRequestRow) -> PendingRequest:
    return PendingRequest(
        tool_call_id=row.tool_call_id,
        kind="client_tool" if row.kind == "client" else "approval",
        id=row.message_id,
        turn_id=row.turn_id,
        name=row.tool_name,
        arguments=row.arguments,
        requested_at=row.requested_at,
        expires_at=row.expires_at,
        decisions=list(DECISIONS) if row.kind == "approval" else None,
    )
