"""The Vercel AI SDK's wire contract, as Parley takes and answers it (docs/adapters.md): the body
`DefaultChatTransport` posts (`{id, messages, trigger, messageId?}`), the `UIMessage`s it holds, and the UI
message stream's chunks, chosen per major version of the `ai` package so that a client never gets a chunk
its schema does not know.

Only the last message of a request is new input; the rest is the client's copy of the history, which
Parley does not read (its own stored history is the truth)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictInt, field_validator, model_validator

from app.protocol.files import DATA_URL_PATTERN, AttachmentRef, DataUrlAttachment, FileAttachment
from app.protocol.tool_requests import ClientTool, unique_client_tools

# The `ai` package's majors whose UI message stream Parley speaks; the current one is the default.
SDK_VERSIONS = (5, 6, 7)
CURRENT_SDK_VERSION = 7
STREAM_HEADER = "x-vercel-ai-ui-message-stream"
STREAM_PROTOCOL = "v1"
# A chat id is any string a kit makes (nanoid by default); it is stored as its digest.
MAX_CHAT_ID = 1000

SdkVersion = Annotated[StrictInt, Field(ge=SDK_VERSIONS[0], le=SDK_VERSIONS[-1])]

# Chunk types each major's schema (uiMessageChunkSchema) knows beyond those of 5; a chunk of another type
# is never sent to that major.
_NEWER_CHUNKS: dict[str, int] = {
    "tool-approval-request": 6,
    "tool-output-denied": 6,
    "custom": 7,
    "reset-step": 7,
    "steering-message": 7,
}
# finishReason values each major knows.
FINISH_REASONS: dict[int, frozenset[str]] = {
    5: frozenset({"stop", "length", "content-filter", "tool-calls", "error", "other", "unknown"}),
    6: frozenset({"stop", "length", "content-filter", "tool-calls", "error", "other"}),
    7: frozenset({"stop", "length", "content-filter", "tool-calls", "error", "interrupted", "other"}),
}


def knows_chunk(version: int, chunk_type: str) -> bool:
    return _NEWER_CHUNKS.get(chunk_type, SDK_VERSIONS[0]) <= version


class TextPart(BaseModel):
    """A user message's text. Other fields a kit adds (`state`, `providerMetadata`) are ignored."""

    model_config = ConfigDict(extra="allow")

    type: Literal["text"]
    text: str = Field(max_length=10_000_000)


# A file part the history gave back (`_file_part` in chat.adapters.ai_sdk): Parley's content route, as a
# path or a full URL; the file it names is attached again as it is.
CONTENT_URL_PATTERN = r"^(https?://[^/\s]+)?/v1/files/(f_[0-9a-f]{16})/content$"
_FILE_URL_PATTERN = f"({DATA_URL_PATTERN})|({CONTENT_URL_PATTERN})"


class FilePart(BaseModel):
    """A file the kit attached (`convertFileListToFileUIParts` makes data URLs): taken as an attachment of
    the message, checked and stored as an upload is (docs/files.md); or one the history gave back, at
    Parley's content route (an edited message keeps its files so)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["file"]
    mediaType: str = Field(min_length=1, max_length=200)
    url: str = Field(
        pattern=_FILE_URL_PATTERN,
        description="`data:<media type>;base64,<bytes>`, or a file of the caller at "
        "`/v1/files/{file_id}/content`.",
    )
    filename: str | None = Field(None, max_length=255)

    def attachment(self) -> AttachmentRef:
        found = re.match(CONTENT_URL_PATTERN, self.url)
        if found is not None:
            return FileAttachment(file_id=found[2])
        return DataUrlAttachment(url=self.url)


UserPart = Annotated[TextPart | FilePart, Field(discriminator="type")]


class UIPart(BaseModel):
    """A part of an assistant or system message: text, reasoning, a tool call (`tool-<name>` or
    `dynamic-tool`, with `toolCallId`, `state`, `input`, `output` or `errorText`), data, a step start..."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(min_length=1, max_length=200)


_USER_HAS_TEXT: dict[str, JsonValue] = {
    "contains": {
        "type": "object",
        "required": ["type", "text"],
        "properties": {"type": {"const": "text"}, "text": {"type": "string", "pattern": r"\S"}},
    }
}


class UserUIMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1, max_length=100, description="Kept as the message's client_message_id.")
    role: Literal["user"]
    parts: list[UserPart] = Field(
        min_length=1,
        description="Text parts, at least one with a character that is not whitespace, and file parts "
        "(data URLs), taken as the message's attachments.",
        json_schema_extra=_USER_HAS_TEXT,
    )
    metadata: JsonValue = None

    @model_validator(mode="after")
    def _has_text(self) -> UserUIMessage:
        if not any(isinstance(part, TextPart) and part.text.strip() for part in self.parts):
            raise ValueError("the user message has no text")
        return self

    def text(self) -> str:
        return "\n\n".join(p.text for p in self.parts if isinstance(p, TextPart) and p.text.strip())

    def attachments(self) -> list[AttachmentRef]:
        return [p.attachment() for p in self.parts if isinstance(p, FilePart)]


class OtherUIMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1, max_length=200)
    role: Literal["assistant", "system"]
    parts: list[UIPart]
    metadata: JsonValue = None


UIMessageIn = Annotated[UserUIMessage | OtherUIMessage, Field(discriminator="role")]


class ChatRequest(BaseModel):
    """What `DefaultChatTransport` posts. Only the last message is new input: a user message (its text is
    posted to the session), or the assistant message the kit completed with browser-side tool outputs
    (each `output-available` or `output-error` part whose call waits is posted as that call's result)."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(
        min_length=1,
        max_length=MAX_CHAT_ID,
        description="The chat: a session of the caller (its `s_` id), or any other id, bound to a session of "
        "its own for the caller on first use (the same id finds the same session again).",
    )
    messages: list[UIMessageIn] = Field(
        min_length=1,
        max_length=100_000,
        description="The client's messages; only the last one is read. A last message that is not a user "
        "message and answers no waiting tool call: 409 `no_new_input`.",
    )
    trigger: Literal["submit-message", "regenerate-message"] = Field(
        description="`submit-message`: the last message is new input (with `messageId`, the edit of that "
        "sent message: a new branch beside its turn, docs/api.md Branches). `regenerate-message`: the answer "
        "`messageId` names (an assistant message's id, or a user message's: its turn), or else the latest "
        "turn, answered again as a new branch; the request's messages add nothing."
    )
    messageId: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_CHAT_ID,
        description="The message a regenerate or an edit is about: an id `GET /v1/ai-sdk/chat/{id}/messages` "
        "gave (unknown on the chat's active path: 404).",
    )
    client_tools: list[ClientTool] | None = Field(
        None,
        max_length=64,
        description="Parley's client tools offered for this turn (the transport's `body` option adds them): "
        "the browser runs them through the kit's `onToolCall` and `addToolOutput`.",
    )

    _unique = field_validator("client_tools")(unique_client_tools)


STREAM_DOC = """The turn as the AI SDK's UI message stream, protocol v1 (`x-vercel-ai-ui-message-stream: v1`):
one `data: <chunk JSON>` line per chunk, and `data: [DONE]` last. Not Parley's event stream: the chunks
are the `ai` package's (`start`, `start-step`, `text-start`, `text-delta`, `text-end`, `reasoning-*`,
`tool-input-start`, `tool-input-delta`, `tool-input-available`, `tool-output-available`,
`tool-output-error`, `tool-approval-request` from major 6, transient `data-parley-*` parts, `finish-step`,
`finish`, `abort`, `error`), for the major version asked for. The stream ends with the turn, or when a
browser-side tool call (from major 6, an approval too) waits for the kit (`finish` with
`finishReason: "tool-calls"`)."""

# The stream's schema in the spec: each frame as an SSE parser yields it (as EventFrame is for Parley's own).
FRAME_SCHEMA: dict[str, Any] = {
    "title": "UiMessageStreamFrame",
    "description": "One frame of the AI SDK's UI message stream, as an SSE parser yields it: its `data` is "
    "one chunk's JSON (an object with a `type`, the `ai` package's uiMessageChunkSchema), or `[DONE]` in "
    "the last frame. `: ping` comments carry nothing.",
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}},
}
