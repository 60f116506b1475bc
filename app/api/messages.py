"""Message routes: post a user message, read the history, stop the running turn."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from app.api.deps import ChatDep
from app.api.responses import errors
from app.schemas import CancelResult, MessageAccepted, MessageCreate, MessagePage

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["messages"])


@router.post("/messages", status_code=status.HTTP_202_ACCEPTED, responses=errors(404, 422))
async def post_message(session_id: str, body: MessageCreate, chat: ChatDep) -> MessageAccepted:
    """Store a user message (durably, before answering) and start a turn, or wait for the running one."""
    return await chat.post_message(session_id, body.content, body.sender)


@router.get("/messages", responses=errors(400, 404, 422))
async def list_messages(
    session_id: str,
    chat: ChatDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 500,
    after: Annotated[str | None, Query(description="Return messages after this message id.")] = None,
    before: Annotated[
        str | None, Query(description="Return the messages just before this message id.")
    ] = None,
) -> MessagePage:
    """The session's chat_messages in order (seed 000 §2.2.1), a page at a time."""
    return await chat.history(session_id, limit=limit, after=after, before=before)


@router.post(
    "/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    responses={200: {"model": CancelResult, "description": "Nothing was running"}, **errors(404)},
)
async def cancel(session_id: str, chat: ChatDep, response: Response) -> CancelResult:
    """Stop the running turn now, keeping its partial output; 200 with cancelled=false when idle."""
    result = await chat.cancel(session_id)
    if not result.cancelled:
        response.status_code = status.HTTP_200_OK
    return result
