"""The session's Server-Sent Events stream."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter
from sse_starlette import EventSourceResponse, ServerSentEvent

from app.api.deps import ServicesDep
from app.api.responses import errors

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["events"])

_STREAM_DOC = """Every event of the session, across all its turns, until the client leaves.

Framing: each event is one SSE frame with `id:` the session's sequence number (+1 per event),
`event:` the event type and `data:` one JSON object that repeats `type` and carries `seq` and
`session_id`. A comment line (`: ping`) is sent as a heartbeat while nothing happens."""


@router.get(
    "/events",
    response_class=EventSourceResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "The event stream"}, **errors(404)},
    description=_STREAM_DOC,
)
async def stream_events(session_id: str, services: ServicesDep) -> EventSourceResponse:
    await services.chat.get_row(session_id)
    channel = await services.broker.channel(session_id)
    subscriber = channel.subscribe()

    async def frames() -> AsyncIterator[ServerSentEvent]:
        try:
            while True:
                batch = await subscriber.next_batch()
                if batch is None:
                    return
                for frame in batch:
                    yield ServerSentEvent(data=frame.data, event=frame.type, id=str(frame.seq))
        finally:
            channel.unsubscribe(subscriber)

    return EventSourceResponse(
        frames(),
        ping=services.settings.sse_ping_interval,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        send_timeout=30,
    )
