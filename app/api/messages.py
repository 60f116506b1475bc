"""Message routes: post a user message, read the history, stop the running turn."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status

from app.api.deps import IdempotencyKey, MessagePosterDep, MessagesDep, PrincipalDep, TurnsDep
from app.api.responses import v1_errors
from app.api.turn_wait import WAIT_TIMEOUT_RESPONSE, WaitDep, unless_disconnected
from app.protocol.ids import MESSAGE_ID_PATTERN
from app.protocol.schemas import (
    CancelRequest,
    CancelResult,
    MessageAccepted,
    MessageCreate,
    MessagePage,
    QueuedMessage,
    QueueList,
)
from app.protocol.turns import Turn

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["messages"])


_POST_DOC = """Store a user message (durably, before answering): it starts a turn, or waits as `delivery`
says.

With `wait=true` the answer comes once the turn that takes the message has ended: 200 with that turn, as
`GET .../turns/{turn_id}` shows it (its `status` says how it ended). A message that waits behind a running
turn is answered with the later turn that takes it. Nothing is sent before the answer; if `timeout` (or
PARLEY_WAIT_TIMEOUT) passes first: 504 `wait_timeout` with `details.turn_id` (null while the message waits
for a turn) and `details.message_id`; the turn goes on, and `GET .../turns/{turn_id}?wait=true` waits
again. A retry with the same Idempotency-Key waits for the same message's turn. A client that disconnects
stops its wait, never the turn. 409 `withdrawn` if the message is withdrawn before a turn takes it."""


@router.post(
    "/messages",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=None,
    responses={
        202: {"model": MessageAccepted, "description": "Stored; without wait=true"},
        200: {"model": Turn, "description": "With wait=true: the turn that took the message, ended"},
        **v1_errors(404, 409, 413, 415, 422, 429),
        **WAIT_TIMEOUT_RESPONSE,
    },
    description=_POST_DOC,
)
async def post_message(
    session_id: str,
    body: MessageCreate,
    messages: MessagesDep,
    turns: TurnsDep,
    principal: MessagePosterDep,
    request: Request,
    response: Response,
    wait: WaitDep,
    idempotency_key: IdempotencyKey = None,
) -> MessageAccepted | Turn:
    answer: MessageAccepted | Turn
    if wait is None:
        answer, replayed = await messages.post(principal, session_id, body, idempotency_key=idempotency_key)
    else:
        waiting = turns.post_and_wait(
            principal, session_id, body, idempotency_key=idempotency_key, timeout=wait.timeout
        )
        answer, replayed = await unless_disconnected(request, waiting)
        response.status_code = status.HTTP_200_OK
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return answer


@router.get("/messages", responses=v1_errors(404, 422))
async def list_messages(
    session_id: str,
    messages: MessagesDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 500,
    after: Annotated[
        str | None,
        Query(
            pattern=MESSAGE_ID_PATTERN,
            description="Return messages after this message id (a `next_cursor`); an id that is not a "
            "message of this session: 422 `invalid_cursor`.",
        ),
    ] = None,
    before: Annotated[
        str | None,
        Query(
            pattern=MESSAGE_ID_PATTERN,
            description="Return the messages just before this message id; an id that is not a message of "
            "this session: 422 `invalid_cursor`.",
        ),
    ] = None,
) -> MessagePage:
    """The session's chat_messages in order (docs/protocol.md), a page at a time."""
    return await messages.history(principal, session_id, limit=limit, after=after, before=before)


@router.post(
    "/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    responses={
        200: {"model": CancelResult, "description": "Nothing was running"},
        **v1_errors(404, 413, 415, 422, 503),
    },
)
async def cancel(
    session_id: str,
    messages: MessagesDep,
    principal: PrincipalDep,
    response: Response,
    body: CancelRequest | None = None,
) -> CancelResult:
    """Stop the running turn now, keeping its partial output; 200 with cancelled=false when idle; 503
    (`storage_full`, `storage_busy`, `storage_error`) when storage refuses the turn's end for now."""
    result = await messages.cancel(principal, session_id, clear_queue=body.clear_queue if body else False)
    if not result.cancelled:
        response.status_code = status.HTTP_200_OK
    return result


@router.get("/queue", responses=v1_errors(404))
async def list_queue(session_id: str, messages: MessagesDep, principal: PrincipalDep) -> QueueList:
    """Messages acknowledged while a turn runs and not taken by a turn yet, in order."""
    return await messages.queue(principal, session_id)


@router.delete("/queue/{message_id}", responses=v1_errors(404, 409))
async def withdraw(
    session_id: str, message_id: str, messages: MessagesDep, principal: PrincipalDep
) -> QueuedMessage:
    """Withdraw a waiting message; 409 once a turn has taken it."""
    return await messages.withdraw(principal, session_id, message_id)
