"""Routes of calls that wait outside the service: client tools' results, approvals, what waits."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import PrincipalDep, ToolAnswersDep
from app.api.responses import v1_errors
from app.protocol.tool_requests import ApprovalsIn, PendingList, ResolutionResult, ToolResultsIn

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["tool requests"])


@router.post("/tool_results", responses=v1_errors(404, 409, 410, 413, 415, 422))
async def post_tool_results(
    session_id: str, body: ToolResultsIn, answers: ToolAnswersDep, principal: PrincipalDep
) -> ResolutionResult:
    """Results of client tool calls (each `output` or `error`); the turn resumes once none waits. 409 for
    a call that does not wait, 410 after its expiry; the same result again is a replay."""
    return await answers.tool_results(principal, session_id, body)


@router.post("/approvals", responses=v1_errors(404, 409, 410, 413, 415, 422))
async def post_approvals(
    session_id: str, body: ApprovalsIn, answers: ToolAnswersDep, principal: PrincipalDep
) -> ResolutionResult:
    """Decide every open approval request of the round: approve, edit (arguments checked against the
    tool's schema, 422 if they do not fit) or reject (with a reason the model reads)."""
    return await answers.approvals(principal, session_id, body)


@router.get("/pending", responses=v1_errors(404))
async def list_pending(session_id: str, answers: ToolAnswersDep, principal: PrincipalDep) -> PendingList:
    """What waits for an answer: client tool calls and approval requests, with their expiry."""
    return await answers.pending(principal, session_id)
