"""Session routes: create, list, read, update, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response, status

from app.api.deps import METADATA_FILTER_PARAMETER, IdempotencyKey, MetadataFilter, PrincipalDep, SessionsDep
from app.api.responses import v1_errors
from app.protocol.schemas import (
    CURSOR_PATTERN,
    SessionContext,
    SessionCreate,
    SessionOut,
    SessionPage,
    SessionUpdate,
    StreamToken,
)

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    responses={
        **v1_errors(413, 415, 422),
        410: {
            **v1_errors(410)[410],
            "description": "An Idempotency-Key replay whose session has since "
            "been deleted (`session_deleted`): use a new key to create another session.",
        },
    },
)
async def create_session(
    body: SessionCreate,
    sessions: SessionsDep,
    principal: PrincipalDep,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> SessionOut:
    """Create a chat session with a model, an optional system prompt and the tools it may use."""
    session, replayed = await sessions.create(principal, body, idempotency_key=idempotency_key)
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return session


@router.get("", responses=v1_errors(422), openapi_extra={"parameters": [METADATA_FILTER_PARAMETER]})
async def list_sessions(
    sessions: SessionsDep,
    principal: PrincipalDep,
    metadata: Annotated[list[tuple[str, str]], Depends(MetadataFilter())],
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[
        str | None,
        Query(
            pattern=CURSOR_PATTERN,
            max_length=400,
            description="`next_cursor` of the previous page, as it was (opaque); one the server did not "
            "make: 422 `invalid_cursor`.",
        ),
    ] = None,
) -> SessionPage:
    """List the caller's sessions, newest first; `metadata.<key>=<value>` keeps those whose metadata holds
    it (each such parameter narrows the list)."""
    return await sessions.page(principal, limit, cursor, metadata)


@router.get("/{session_id}", responses=v1_errors(404))
async def get_session(session_id: str, sessions: SessionsDep, principal: PrincipalDep) -> SessionOut:
    """Read a session, including its live agent_status and running turn."""
    return await sessions.get(principal, session_id)


@router.patch("/{session_id}", responses=v1_errors(404, 413, 415, 422))
async def update_session(
    session_id: str, body: SessionUpdate, sessions: SessionsDep, principal: PrincipalDep
) -> SessionOut:
    """Change the title, system prompt, model or context policy; they apply from the next model call."""
    return await sessions.update(principal, session_id, body)


@router.get("/{session_id}/context", responses=v1_errors(404))
async def get_session_context(
    session_id: str, sessions: SessionsDep, principal: PrincipalDep
) -> SessionContext:
    """What the next model call would send: the summary of the oldest turns and the verbatim tail."""
    return await sessions.context(principal, session_id)


@router.post("/{session_id}/stream_token", responses=v1_errors(404))
async def create_stream_token(session_id: str, sessions: SessionsDep, principal: PrincipalDep) -> StreamToken:
    """A short-lived token that opens this session's event stream only, as `?access_token=`: an
    EventSource URL then carries no long-lived credential (PARLEY_STREAM_TOKEN_SECONDS, 5 minutes by
    default; a stream it opened goes on after it expires)."""
    return await sessions.stream_token(principal, session_id)


@router.delete("/{session_id}", status_code=status.HTTP_204_NO_CONTENT, responses=v1_errors(404))
async def delete_session(session_id: str, sessions: SessionsDep, principal: PrincipalDep) -> Response:
    """Stop the session's turn if one runs, then delete the session with its history."""
    await sessions.delete(principal, session_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
