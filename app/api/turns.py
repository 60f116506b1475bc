"""Turn routes: a session's chat_messages grouped by turn (docs/protocol.md, Turns)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from app.api.deps import PrincipalDep, TurnsDep
from app.api.responses import v1_errors
from app.api.turn_wait import WAIT_TIMEOUT_RESPONSE, WaitDep, unless_disconnected
from app.protocol.ids import TURN_ID_PATTERN
from app.protocol.turns import Turn, TurnPage

router = APIRouter(prefix="/v1/sessions/{session_id}/turns", tags=["turns"])


@router.get("", responses=v1_errors(404, 422))
async def list_turns(
    session_id: str,
    turns: TurnsDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    before: Annotated[
        str | None,
        Query(
            pattern=TURN_ID_PATTERN,
            description="A turn id (a `next_cursor`): return the turns just before it; an id that is not "
            "a turn of this session: 422 `invalid_cursor`.",
        ),
    ] = None,
) -> TurnPage:
    """The session's newest turns, oldest first; page back with `before`."""
    return await turns.page(principal, session_id, limit=limit, before=before)


@router.get("/{turn_id}", responses={**v1_errors(404, 422), **WAIT_TIMEOUT_RESPONSE})
async def get_turn(
    session_id: str,
    turn_id: str,
    turns: TurnsDep,
    principal: PrincipalDep,
    request: Request,
    wait: WaitDep,
) -> Turn:
    """One turn with its user input, nodes, status, times and final answer; with `wait=true`, once ended."""
    if wait is None:
        return await turns.get(principal, session_id, turn_id)
    waiting = turns.wait(principal, session_id, turn_id, timeout=wait.timeout)
    return await unless_disconnected(request, waiting)
