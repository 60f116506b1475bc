"""The session's event stream, resumable from any position the log still holds: Server-Sent Events, or
NDJSON (one event's JSON per line) for scripts. Both come from the same subscription, with the same
limits, heartbeats, slow-client drop and shutdown; only the framing differs."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Request
from sse_starlette import EventSourceResponse, ServerSentEvent

from app.api.deps import ServicesDep, StreamPrincipalDep
from app.api.responses import v1_errors
from app.api.sse import EventStreamResponse
from app.chat.limits import StreamSlot
from app.errors import DomainError, NotFound
from app.observability.hooks import events_sent, stream_closed, stream_opened
from app.protocol.openapi import NDJSON_MEDIA_TYPE, STREAM_MEDIA_TYPE
from app.protocol.schemas import QueryBool
from app.streaming.broker import Subscription
from app.streaming.frames import SSE_LINE_END, Frame

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["events"])

# How long a stream may wait on a client that does not read before it is cut (it then resumes).
SEND_TIMEOUT = 30
# At the server's exit the broker's drain ends every stream once the turns have stopped (within
# `shutdown_timeout`) and the log is flushed; sse-starlette cancels a stream only if it outlives both.
SHUTDOWN_FLUSH_GRACE = 5.0
POSITION_PATTERN = r"^[0-9]{1,1000}$"
# The header may have blanks around the number: HTTP servers strip those before a value but not always
# after it (httptools keeps a trailing space), and a script that sends `Last-Event-ID: $id ` means the id.
HEADER_POSITION_PATTERN = r"^[ \t]*[0-9]{0,1000}[ \t]*$"
_BLANKS = " \t"
_POSITION = re.compile(r"[0-9]{1,1000}")
# Frames per body chunk: a long replay goes out in pieces of bounded size.
SEND_FRAMES = 256

_STREAM_DOC = """Every event of the session, across all its turns, until the client leaves; with
`until_idle=true`, until the session is idle and the stream has caught up.

**An endless stream** (`x-endless-stream: true`): without `until_idle=true` the response never ends by
itself, even on an idle session; a client that reads responses to their end (a generic API tester, a
crawler, `curl` without `--max-time`) must send `until_idle=true` or stop reading on its own.

Resuming: the position is the `Last-Event-ID` header (what EventSource sends when it reconnects) or the
`after` query parameter; when both are given the header wins, because a reconnecting EventSource keeps
the URL (and its original `after`) but sends the newer header. The stream then sends every event after
that position, in order, and goes on live, with no gap and no duplicate. Without a position it starts
live. `after` = the `last_event_id` of `GET .../messages` picks up exactly where that history read ended.

When the position cannot be replayed (older than the events kept per session, or newer than any event
the server has) the first frame is a `resync` event whose `id:` and `last_event_id` are the session's
current last event: reload the history, then go on with the frames that follow it. A position that is not
a non-negative integer of at most 1,000 digits is a 422.

The first frame carries only `retry:` (the reconnection delay); a `: ping` comment comes every
`PARLEY_SSE_PING_INTERVAL` seconds. A client that falls too far behind, and every client when the
server shuts down, sees its stream end: reconnecting with Last-Event-ID loses nothing.

The API key or token goes in the `Authorization` header or, for EventSource (which cannot set headers),
in the `access_token` query parameter: best a stream token of `POST .../stream_token`, which opens this
session's stream only and for minutes; over TLS only, since URLs are kept in browser histories and proxy
logs.
A principal may hold `PARLEY_MAX_STREAMS_PER_PRINCIPAL` streams at once; one more gets 429.

`Accept: application/x-ndjson` (or `format=ndjson`, which wins over the header) gives the same events as
NDJSON for scripts and jq: each event's JSON, exactly the bytes of its SSE `data:`, on a line of its
own; a blank line is the heartbeat. Resuming works the same way (`after`, `Last-Event-ID`).

`until_idle=true` is for clients that read a stream to its end (scripts, test tools, crawlers): the
stream ends, cleanly, as soon as no turn runs and every event committed so far has been sent (a turn it
saw start has also ended). On an idle session, with no position or one already caught up, it ends at
once. A turn that starts later (a queued message) is not waited for: reconnect with Last-Event-ID."""

ENDLESS_STREAM = "x-endless-stream"

StreamFormat = Literal["sse", "ndjson"]


class InvalidPosition(DomainError):
    code = "invalid_position"


def resume_position(last_event_id: str | None, after: str | None) -> int | None:
    """The position to resume after: the header (without blanks around it) wins over `after`; an empty
    header means none."""
    header = last_event_id.strip(_BLANKS) if last_event_id else None
    name, raw = ("Last-Event-ID", header) if header else ("after", after)
    if raw is None:
        return None
    try:
        if _POSITION.fullmatch(raw):
            return int(raw)
    except ValueError:  # more digits than int() converts: no stream ever got that far
        pass
    raise InvalidPosition(
        f"{name} must be a non-negative integer: the id of an event of this stream.",
        details={name: raw[:100]},
    )


def wants_ndjson(format: StreamFormat | None, accept: str | None) -> bool:
    """`format` when given; else NDJSON when Accept names application/x-ndjson (q > 0) and does not
    prefer text/event-stream. Wildcards choose nothing: curl's `*/*` and EventSource get SSE."""
    if format is not None:
        return format == "ndjson"
    weights: dict[str, float] = {}
    for item in (accept or "").split(","):
        media, *params = (part.strip() for part in item.split(";"))
        weight = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0
        weights[media.lower()] = max(weight, weights.get(media.lower(), 0.0))
    ndjson = weights.get(NDJSON_MEDIA_TYPE, 0.0)
    return ndjson > 0 and ndjson >= weights.get(STREAM_MEDIA_TYPE, 0.0)


After = Annotated[
    str | None, Query(pattern=POSITION_PATTERN, description="Resume after this event id (seq).")
]
LastEventId = Annotated[
    str | None,
    Header(
        alias="Last-Event-ID",
        pattern=HEADER_POSITION_PATTERN,
        description="Resume after this event id (blanks around it are ignored); wins over after. Empty: "
        "no position.",
    ),
]
UntilIdle = Annotated[
    QueryBool,
    Query(
        description="End the stream once no turn runs and every event so far has been sent. Without it "
        "the stream never ends by itself."
    ),
]
Format = Annotated[
    StreamFormat | None,
    Query(
        description="`ndjson`: one event's JSON per line (as `Accept: application/x-ndjson` asks); "
        "`sse`: Server-Sent Events. Without it the Accept header decides, and SSE is the default."
    ),
]


@router.get(
    "/events",
    response_class=EventSourceResponse,  # the spec; the response itself is an EventStreamResponse
    responses={
        200: {
            "content": {STREAM_MEDIA_TYPE: {}, NDJSON_MEDIA_TYPE: {}},
            "description": "The event stream: SSE, or NDJSON when asked for; endless unless until_idle=true",
        },
        **v1_errors(404, 422, 429),
    },
    description=_STREAM_DOC,
    # For generic clients (schemathesis, crawlers) that read a response to its end: this one does not end
    # unless `until_idle=true`. A vendor extension, since OpenAPI has no word for it.
    openapi_extra={ENDLESS_STREAM: True},
)
async def stream_events(
    session_id: str,
    services: ServicesDep,
    principal: StreamPrincipalDep,
    request: Request,
    after: After = None,
    last_event_id: LastEventId = None,
    until_idle: UntilIdle = False,
    format: Format = None,
) -> EventStreamResponse:
    position = resume_position(last_event_id, after)
    ndjson = wants_ndjson(format, request.headers.get("accept"))
    await services.sessions.owned(principal, session_id)
    lease = await services.streams.acquire(principal)
    try:
        # Subscribed before the response starts: a client that posts once the headers arrive misses nothing.
        subscription = await services.broker.subscribe(session_id, position)
    except BaseException:
        lease.release()
        raise
    settings = services.settings
    stream_opened(resumed=position is not None)
    end = _StreamEnd(subscription, lease)

    async def running() -> str | None:
        try:
            return (await services.sessions.get(principal, session_id)).running_turn_id
        except NotFound:
            return None  # deleted meanwhile: its stream is over

    batches = _until_idle(subscription, running) if until_idle else subscription.batches()
    body = (
        _body(batches, end, _ndjson, _NDJSON_HEARTBEAT)
        if ndjson
        else _body(
            batches, end, _sse, _SSE_HEARTBEAT, ServerSentEvent(retry=settings.sse_retry_ms, sep=SSE_LINE_END)
        )
    )
    return EventStreamResponse(
        body,
        media_type=NDJSON_MEDIA_TYPE if ndjson else STREAM_MEDIA_TYPE,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        send_timeout=SEND_TIMEOUT,
        shutdown_grace=settings.shutdown_timeout + SHUTDOWN_FLUSH_GRACE,
        # Also when the body never starts (HEAD, a client gone at once): nothing is left subscribed.
        on_close=end,
    )


@dataclass(eq=False, slots=True)
class _StreamEnd:
    """Unsubscribes and gives the stream slot back, once: when the body ends (so a client whose last
    send is still pending holds no slot), or else when the response ends."""

    subscription: Subscription
    lease: StreamSlot
    done: bool = False

    def __call__(self) -> None:
        if not self.done:
            self.done = True
            self.subscription.close()
            self.lease.release()
            stream_closed()


async def _until_idle(
    subscription: Subscription, running: Callable[[], Awaitable[str | None]]
) -> AsyncIterator[list[Frame]]:
    """The subscription's batches until it has caught up with an idle session.

    Caught up: nothing waits in its buffer (the broker pushes every delivered frame there at once).
    Idle: no turn runs, and every turn the stream saw start, or found running, has sent its `turn_done`
    to this stream: the live status turns idle just before a turn's `turn_done` commits, so the status
    alone would end the stream one event early."""
    open_turns: set[str] = set()
    done_turns: set[str] = set()

    def note(batch: list[Frame]) -> None:
        for frame in batch:
            turn_id = frame.turn  # set on a turn's edges where the event was made (frames.Frame)
            if turn_id is None:
                continue
            if frame.type == "turn_start":
                open_turns.add(turn_id)
            else:
                open_turns.discard(turn_id)
                done_turns.add(turn_id)

    if subscription.replay:
        note(subscription.replay)
        yield subscription.replay
    subscriber = subscription.subscriber
    while True:
        if not open_turns and not subscriber.buffer:
            turn_id = await running()
            if turn_id is not None and turn_id not in done_turns:
                open_turns.add(turn_id)
            elif not subscriber.buffer:
                return
        batch = await subscriber.next_batch()
        if batch is None:
            return
        note(batch)
        yield batch


async def _body(
    batches: AsyncIterator[list[Frame]],
    end: Callable[[], None],
    encode: Callable[[list[Frame]], bytes],
    heartbeat: bytes,
    first: ServerSentEvent | None = None,
) -> AsyncIterator[ServerSentEvent | bytes]:
    """The frames of each committed batch go out as one body chunk (one send, one socket write per
    batch, not per event), framed by `encode`; an empty batch (the broker's heartbeat) is `heartbeat`."""
    try:
        if first is not None:
            yield first
        async for batch in batches:
            if not batch:
                yield heartbeat
            else:
                events_sent(len(batch), resync=batch[0].type == "resync")
            for start in range(0, len(batch), SEND_FRAMES):
                yield encode(batch[start : start + SEND_FRAMES])
    finally:
        end()


def _sse(frames: list[Frame]) -> bytes:
    """Each frame in sse-starlette's own encoding, made once for all clients (Frame.sse)."""
    return b"".join([frame.sse() for frame in frames])


def _ndjson(frames: list[Frame]) -> bytes:
    """Each frame's data (the JSON of its SSE `data:`, which never holds a raw newline) and a newline."""
    return "".join([f"{frame.data}\n" for frame in frames]).encode()


# The SSE heartbeat is a comment (sse-starlette's encoding); the NDJSON one an empty line, which line
# readers skip and jq reads as whitespace.
_SSE_HEARTBEAT = ServerSentEvent(comment="ping", sep=SSE_LINE_END).encode()
_NDJSON_HEARTBEAT = b"\n"
