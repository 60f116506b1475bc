"""`?wait=true&timeout=`: the query parameters of a request that waits, and the HTTP side of waiting.

A waiting request sends nothing before its status line (so that it can still be a 504); while it waits
the connection is idle, and the launcher's TCP keepalive probes it. A client that closes the connection
stops the wait (never the turn it waited for): Starlette does not cancel a handler whose client left,
so `unless_disconnected` watches the connection itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Query, Request
from starlette.types import Receive

from app.errors import ClientClosedRequest, InvalidRequest
from app.protocol.schemas import ErrorResponse, QueryBool

T = TypeVar("T")

WAIT_TIMEOUT_RESPONSE: dict[int | str, dict[str, Any]] = {
    504: {
        "model": ErrorResponse,
        "description": "With wait=true: the wait's limit passed first (code `wait_timeout`). The turn goes "
        "on; `details.turn_id` (null while the message waits for a turn) lets the client wait again.",
    }
}


@dataclass(frozen=True)
class Wait:
    """A request that waits; `timeout` is the caller's limit in seconds (None: PARLEY_WAIT_TIMEOUT)."""

    timeout: float | None


async def get_wait(
    wait: Annotated[
        QueryBool,
        Query(
            description="Answer once the turn has ended, with the turn; 504 `wait_timeout` (with the turn "
            "id) if the limit passes first, while the turn goes on."
        ),
    ] = False,
    timeout: Annotated[
        float | None,
        Query(
            gt=0,
            allow_inf_nan=False,
            description="Only with wait=true (without it: 422 `wait_required`): the longest wait in "
            "seconds, capped by PARLEY_WAIT_TIMEOUT (default 300).",
        ),
    ] = None,
) -> Wait | None:
    """The request's wait, or None when it answers at once; a timeout without wait=true is a 422."""
    if not wait:
        if timeout is not None:
            raise InvalidRequest("query.timeout", "timeout applies only with wait=true", "wait_required")
        return None
    return Wait(timeout)


WaitDep = Annotated[Wait | None, Depends(get_wait)]


async def unless_disconnected(request: Request, waiting: Coroutine[Any, Any, T]) -> T:
    """The result of `waiting`, unless the client closes the connection first: then `waiting` is cancelled
    and ClientClosedRequest raised (its 499 is logged; nobody is left to read it)."""
    work = asyncio.ensure_future(waiting)
    gone = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not work.done():
            work.cancel()
        gone.cancel()
        await asyncio.gather(work, gone, return_exceptions=True)
    if work.cancelled():
        raise ClientClosedRequest("The client closed the connection while it waited.")
    return work.result()


async def _disconnected(receive: Receive) -> None:
    # The body was read before the handler ran: what comes next is the disconnect.
    while (await receive())["type"] != "http.disconnect":
        pass
