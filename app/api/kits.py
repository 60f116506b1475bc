"""The frontend kits' own protocols over Parley's sessions (docs/adapters.md): the Vercel AI SDK's UI
message stream (`useChat` with `DefaultChatTransport`) and AG-UI (CopilotKit's `HttpAgent`).

Their answers are not Parley's event stream: each is documented with its own frame schema."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Path, Query, Response, status

from app.api.deps import MessagePosterDep, PrincipalDep, Services, ServicesDep
from app.api.events import SEND_TIMEOUT, SHUTDOWN_FLUSH_GRACE
from app.api.responses import v1_errors
from app.api.sse import EventStreamResponse
from app.chat.adapters import ag_ui, ai_sdk
from app.chat.kit_chats import TurnFeed
from app.protocol.ag_ui import FRAME_SCHEMA as AG_UI_FRAME
from app.protocol.ag_ui import STREAM_DOC as AG_UI_DOC
from app.protocol.ag_ui import RunInput
from app.protocol.ai_sdk import (
    CURRENT_SDK_VERSION,
    FRAME_SCHEMA,
    MAX_CHAT_ID,
    STREAM_DOC,
    STREAM_HEADER,
    STREAM_PROTOCOL,
    ChatRequest,
)
from app.protocol.openapi import STREAM_MEDIA_TYPE

router = APIRouter(prefix="/v1", tags=["kits"])

SdkVersionText = Literal["5", "6", "7"]
_VERSION_DOC = (
    f"The major version of the client's `ai` package (5, 6 or 7; default {CURRENT_SDK_VERSION}): chunks "
    "that version does not know are never sent. `v` wins over the header."
)
VersionQuery = Annotated[SdkVersionText | None, Query(alias="v", description=_VERSION_DOC)]
VersionHeader = Annotated[SdkVersionText | None, Header(alias="X-AI-SDK-Version", description=_VERSION_DOC)]
ChatId = Annotated[
    str, Path(min_length=1, max_length=MAX_CHAT_ID, description="The chat id the kit posted as `id`.")
]

_UI_STREAM: dict[int | str, dict[str, Any]] = {
    200: {
        "description": STREAM_DOC,
        "content": {STREAM_MEDIA_TYPE: {"schema": FRAME_SCHEMA}},
        "headers": {
            STREAM_HEADER: {
                "description": "`v1`: the UI message stream protocol.",
                "schema": {"type": "string"},
            },
            "X-Parley-Session-Id": {
                "description": "The chat's session, for Parley's own routes (cancel, approvals).",
                "schema": {"type": "string"},
            },
        },
    }
}
_UI_MESSAGE: dict[str, Any] = {
    "type": "object",
    "required": ["id", "role", "parts"],
    "properties": {
        "id": {"type": "string"},
        "role": {"type": "string", "enum": ["user", "assistant"]},
        "parts": {"type": "array", "items": {"type": "object", "required": ["type"]}},
    },
}


def _version(query: str | None, header: str | None) -> int:
    return int(query or header or CURRENT_SDK_VERSION)


def _ui_stream(feed: TurnFeed, stream: ai_sdk.UiMessageStream, services: Services) -> EventStreamResponse:
    settings = services.settings
    return EventStreamResponse(
        ai_sdk.sse_chunks(feed, stream),
        media_type=STREAM_MEDIA_TYPE,
        headers={
            "Cache-Control": "no-store",
            "X-Accel-Buffering": "no",
            STREAM_HEADER: STREAM_PROTOCOL,
            "X-Parley-Session-Id": feed.session_id,
        },
        send_timeout=SEND_TIMEOUT,
        shutdown_grace=settings.shutdown_timeout + SHUTDOWN_FLUSH_GRACE,
        on_close=feed.close,
    )


@router.post(
    "/ai-sdk/chat",
    response_class=Response,
    responses={**_UI_STREAM, **v1_errors(404, 409, 413, 415, 422, 429)},
)
async def ai_sdk_chat(
    body: ChatRequest,
    services: ServicesDep,
    principal: MessagePosterDep,
    v: VersionQuery = None,
    version: VersionHeader = None,
) -> EventStreamResponse:
    """The AI SDK's chat endpoint: the last message's new input, answered with the turn that takes it as a
    UI message stream. The chat id binds to a session of the caller; closing the request never stops the
    turn (`POST /v1/sessions/{X-Parley-Session-Id}/cancel` does)."""
    feed, stream = await ai_sdk.answer(services.kits, principal, body, _version(v, version))
    return _ui_stream(feed, stream, services)


@router.get(
    "/ai-sdk/chat/{chat_id}/stream",
    response_class=Response,
    responses={
        **_UI_STREAM,
        204: {"description": "No turn runs in the chat (or the chat is unknown)"},
        **v1_errors(422, 429),
    },
)
async def ai_sdk_resume(
    chat_id: ChatId,
    services: ServicesDep,
    principal: PrincipalDep,
    v: VersionQuery = None,
    version: VersionHeader = None,
) -> Response:
    """The AI SDK's resume: the chat's running turn replayed from its `start` chunk, then live, from the
    event log (after a restart too, and on any replica); 204 when no turn runs."""
    resumed = await ai_sdk.resume(services.kits, principal, chat_id, _version(v, version))
    if resumed is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return _ui_stream(*resumed, services)


@router.get(
    "/ai-sdk/chat/{chat_id}/messages",
    responses={
        200: {
            "description": "The chat's history as the AI SDK's UIMessage[] (empty for an unknown chat)",
            "content": {"application/json": {"schema": {"type": "array", "items": _UI_MESSAGE}}},
        },
        **v1_errors(),
    },
)
async def ai_sdk_messages(
    chat_id: ChatId, services: ServicesDep, principal: PrincipalDep
) -> list[dict[str, Any]]:
    """The chat's stored history (Parley's, the truth) as `UIMessage`s, for `useChat({messages})`."""
    return await ai_sdk.chat_messages(services.kits, principal, chat_id)


@router.post(
    "/ag-ui",
    response_class=Response,
    responses={
        200: {"description": AG_UI_DOC, "content": {STREAM_MEDIA_TYPE: {"schema": AG_UI_FRAME}}},
        **v1_errors(404, 409, 410, 413, 415, 422, 429),
    },
)
async def ag_ui_run(
    body: RunInput, services: ServicesDep, principal: MessagePosterDep
) -> EventStreamResponse:
    """An AG-UI agent (CopilotKit's `HttpAgent`): the run's new input taken into the thread's session,
    answered with AG-UI events; a run without new input attaches to the thread (a snapshot, then the
    running turn). Closing the request never stops the turn."""
    feed, run, first = await ag_ui.start(services.kits, principal, body)
    settings = services.settings
    return EventStreamResponse(
        ag_ui.sse_events(feed, run, first),
        media_type=STREAM_MEDIA_TYPE,
        headers={
            "Cache-Control": "no-store",
            "X-Accel-Buffering": "no",
            "X-Parley-Session-Id": run.session_id,
        },
        send_timeout=SEND_TIMEOUT,
        shutdown_grace=settings.shutdown_timeout + SHUTDOWN_FLUSH_GRACE,
        on_close=feed.close if feed is not None else _nothing,
    )


def _nothing() -> None:
    """A run with nothing to follow holds no stream."""
