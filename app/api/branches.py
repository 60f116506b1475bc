"""Branch routes (docs/api.md, Branches): regenerate an answer, edit a message, switch the active path,
fork a session."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from app.api.deps import BranchesDep, IdempotencyKey, MessagePosterDep, PrincipalDep
from app.api.responses import v1_errors
from app.protocol.branches import (
    ActivateRequest,
    ActivePath,
    BranchTurn,
    EditRequest,
    ForkRequest,
    RegenerateRequest,
)
from app.protocol.schemas import SessionOut

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["branches"])


def _replayed(response: Response, replayed: bool) -> None:
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"


@router.post(
    "/turns/{turn_id}/regenerate",
    status_code=status.HTTP_202_ACCEPTED,
    responses=v1_errors(404, 409, 413, 415, 422, 429, 503),
)
async def regenerate(
    session_id: str,
    turn_id: str,
    branches: BranchesDep,
    principal: MessagePosterDep,
    response: Response,
    body: RegenerateRequest | None = None,
    idempotency_key: IdempotencyKey = None,
) -> BranchTurn:
    """Answer the turn's user input again, in a new turn beside it that heads the active path; 409 while a
    turn runs (unless `delivery: interrupt`)."""
    turn, replayed = await branches.regenerate(
        principal, session_id, turn_id, body or RegenerateRequest(), idempotency_key=idempotency_key
    )
    _replayed(response, replayed)
    return turn


@router.post(
    "/turns/{turn_id}/edit",
    status_code=status.HTTP_202_ACCEPTED,
    responses=v1_errors(404, 409, 413, 415, 422, 429, 503),
)
async def edit(
    session_id: str,
    turn_id: str,
    body: EditRequest,
    branches: BranchesDep,
    principal: MessagePosterDep,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> BranchTurn:
    """Send an edited user message in a new turn beside the turn, which heads the active path; 409 while a
    turn runs (unless `delivery: interrupt`)."""
    turn, replayed = await branches.edit(
        principal, session_id, turn_id, body, idempotency_key=idempotency_key
    )
    _replayed(response, replayed)
    return turn


@router.post("/turns/{turn_id}/activate", responses=v1_errors(404, 409, 413, 415, 422, 503))
async def activate(
    session_id: str,
    turn_id: str,
    branches: BranchesDep,
    principal: PrincipalDep,
    response: Response,
    body: ActivateRequest | None = None,
    idempotency_key: IdempotencyKey = None,
) -> ActivePath:
    """Make the active path the one through the turn, down to the most recent turn under it; 409 while a
    turn runs (unless `delivery: interrupt`)."""
    path, replayed = await branches.activate(
        principal, session_id, turn_id, body or ActivateRequest(), idempotency_key=idempotency_key
    )
    _replayed(response, replayed)
    return path


@router.post("/fork", status_code=status.HTTP_201_CREATED, responses=v1_errors(404, 409, 413, 415, 422))
async def fork(
    session_id: str,
    body: ForkRequest,
    branches: BranchesDep,
    principal: PrincipalDep,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> SessionOut:
    """A new session with this one's settings whose history is a copy of the active path up to the turn."""
    session, replayed = await branches.fork(principal, session_id, body, idempotency_key=idempotency_key)
    _replayed(response, replayed)
    return session
