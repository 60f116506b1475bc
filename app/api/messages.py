"""Message routes: post a user message, read the history, stop the running turn."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from app.api.deps import ChatDep, IdempotencyKey, MessagePosterDep, PrincipalDep
from app.api.responses import v1_errors
from app.schemas import (
    CancelRequest,
    CancelResult,
    MessageAccepted,
    MessageCreate,
    MessagePage,
    QueuedMessage,
    QueueList,
)

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["messages"])


@router.post(
    "/messages",
    status_code=status.HTTP_202_ACCEPTED,
    responses=v1_errors(400, 404, 409, 413, 415, 422, 429, 503),
)
async def post_message(
    session_id: str,
    body: MessageCreate,
    chat: ChatDep,
    principal: MessagePosterDep,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> MessageAccepted:
    """Store a user message (durably, before answering); it starts a turn, or waits as `delivery` says."""
    accepted, replayed = await chat.post_message(principal, session_id, body, idempotency_key=idempotency_key)
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return accepted


@router.get("/messages", responses=v1_errors(400, 404, 422))
async def list_messages(
    session_id: str,
    chat: ChatDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 500,
    after: Annotated[str | None, Query(description="Return messages after this message id.")] = None,
    before: Annotated[
        str | None, Query(description="Return the messages just before this message id.")
    ] = None,
) -> MessagePage:
    """The session's chat_messages in order (seed 000 §2.2.1), a page at a time."""
    return await chat.history(principal, session_id, limit=limit, after=after, before=before)


@router.post(
    "/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    responses={
        200: {"model": CancelResult, "description": "Nothing was running"},
        **v1_errors(404, 413, 415, 422),
    },
)
async def cancel(
    session_id: str,
    chat: ChatDep,
    principal: PrincipalDep,
    response: Response,
    body: CancelRequest | None = None,
) -> CancelResult:
    """Stop the running turn now, keeping its partial output; 200 with cancelled=false when idle."""
    result = await chat.cancel(principal, session_id, clear_queue=body.clear_queue if body else False)
    if not result.cancelled:
        response.status_code = status.HTTP_200_OK
    return result


@router.get("/queue", responses=v1_errors(404))
async def list_queue(session_id: str, chat: ChatDep, principal: PrincipalDep) -> QueueList:
    """Messages acknowledged while a turn runs and not taken by a turn yet, in order."""
    return await chat.queue(principal, session_id)


@router.delete("/queue/{message_id}", responses=v1_errors(404, 409))
async def withdraw(session_id: str, message_id: str, chat: ChatDep, principal: PrincipalDep) -> QueuedMessage:
    """Withdraw a waiting message; 409 once a turn has taken it."""
    return await chat.withdraw(principal, session_id, message_id)
