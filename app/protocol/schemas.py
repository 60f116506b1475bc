"""REST request and response bodies, and the chat_messages shapes of docs/protocol.md."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
)
from pydantic.json_schema import SkipJsonSchema, WithJsonSchema

from app.protocol.events import AgentState, TurnStatus
from app.protocol.files import MAX_ATTACHMENTS_SCHEMA, Attachment, AttachmentRef
from app.protocol.tool_requests import ApprovalRule, ClientTool, unique_client_tools


def _query_bool(value: object) -> object:
    """A query boolean is `true` or `false`, as the spec's boolean serializes: pydantic's lax parsing
    would also take 1, 0, yes, off, t, n and the like."""
    if isinstance(value, bool):
        return value
    if value in ("true", "false"):
        return value == "true"
    raise ValueError("must be true or false")


QueryBool = Annotated[bool, BeforeValidator(_query_bool)]


def _json_integer(value: object) -> object:
    """A JSON Schema integer: 3, or 3.0 (a number whose fraction is zero is one); never "3" or true,
    which lax parsing would take."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# Body integers within their bounds: what the spec's `integer` with its bounds says, no more (the bounds
# before the validator, so that the spec states them as minimum and maximum).
KeepTurns = Annotated[int, Field(strict=True, ge=1, le=100), BeforeValidator(_json_integer)]
ReserveTokens = Annotated[int, Field(strict=True, ge=0, le=1_000_000), BeforeValidator(_json_integer)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# The session list's `next_cursor`: URL-safe base64, opaque to clients.
CURSOR_PATTERN = r"^[A-Za-z0-9_-]+={0,2}$"

# A session's metadata: the product's own ids and labels. The schema's bounds imply the size limit: 16
# entries of a 64-character key and a value of at most 192 characters are 4,096 characters at most.
METADATA_MAX_KEYS = 16
METADATA_KEY_PATTERN = r"^[A-Za-z0-9_.:-]{1,64}$"
METADATA_MAX_CHARS = 4096
METADATA_MAX_STRING = 192
# Integers a JSON number holds exactly in any client (JavaScript's safe integers).
METADATA_MAX_INT = 2**53 - 1

MetadataValue = (
    Annotated[StrictStr, Field(max_length=METADATA_MAX_STRING)]
    | StrictBool
    | Annotated[StrictInt, Field(ge=-METADATA_MAX_INT, le=METADATA_MAX_INT)]
    | Annotated[float, Field(strict=True, allow_inf_nan=False)]
)


def metadata_text(value: str | bool | int | float) -> str:
    """The text a list filter compares a value with: a string as is, a number or boolean as JSON writes it."""
    return value if isinstance(value, str) else json.dumps(value)


def _check_metadata(value: dict[str, Any]) -> dict[str, Any]:
    size = sum(len(key) + len(metadata_text(v)) for key, v in value.items())
    if size > METADATA_MAX_CHARS:
        raise ValueError(
            f"metadata holds {size} characters of keys and values; the limit is {METADATA_MAX_CHARS}"
        )
    return value


_METADATA_SCHEMA = {
    "type": "object",
    "maxProperties": METADATA_MAX_KEYS,
    "propertyNames": {"pattern": METADATA_KEY_PATTERN},
    "additionalProperties": {
        "anyOf": [
            {"type": "string", "maxLength": METADATA_MAX_STRING},
            {"type": "boolean"},
            {"type": "integer", "minimum": -METADATA_MAX_INT, "maximum": METADATA_MAX_INT},
            {"type": "number"},
        ]
    },
    "description": "The product's own ids and labels: at most 16 keys (letters, digits, `_ . : -`, up to 64 "
    "characters), each a string (up to 192 characters), a boolean or a finite number; keys and values "
    "hold at most 4,096 characters in all. `GET /v1/sessions?metadata.<key>=<value>` lists the sessions "
    "that hold it.",
}

Metadata = Annotated[
    dict[Annotated[str, Field(pattern=METADATA_KEY_PATTERN)], MetadataValue],
    Field(max_length=METADATA_MAX_KEYS),
    AfterValidator(_check_metadata),
    WithJsonSchema(_METADATA_SCHEMA),
]

_MODEL = (
    "A model of GET /v1/models, or one LiteLLM can route (`provider/model`); any other: 422 `unknown_model`."
)


class ContextPolicy(_Strict):
    """How a session's turns fit its model's window (docs/context.md); fields left out keep their value
    (the server's defaults at creation)."""

    strategy: Literal["auto", "off"] | None = Field(
        None,
        description="`auto`: when the history outgrows the window, a turn sends old bulky tool results as "
        "placeholders and the oldest turns as a running summary (the history itself never changes); `off`: "
        "the whole history is sent, and a turn that does not fit fails with `context_window_exceeded`.",
    )
    keep_turns: KeepTurns | None = Field(None, description="The last turns always sent verbatim.")
    reserve_tokens: ReserveTokens | None = Field(
        None, description="Room, in tokens, kept free in the window for the answer."
    )


class ContextPolicyOut(BaseModel):
    strategy: Literal["auto", "off"]
    keep_turns: int
    reserve_tokens: int


class SessionCreate(_Strict):
    model: str | None = Field(None, description=f"{_MODEL} The default model if omitted or null.")
    title: str | None = Field(None, max_length=200)
    system_prompt: str | None = Field(None, max_length=100_000)
    tools: list[str] | None = Field(
        None,
        description="Tool names (GET /v1/tools lists them), or an MCP server's name (`github` or `github/*`) "
        "for all its tools; all built-in tools if omitted or null. An unknown name: 422 `unknown_tool`.",
    )
    client_tools: list[ClientTool] | None = Field(
        None,
        max_length=64,
        description="Tools the client runs: a call suspends the turn until POST .../tool_results answers it.",
    )
    approval: ApprovalRule | None = Field(
        None,
        description='Tools that wait for a person before they run: ["name", ...] or {"name": "always"}; '
        '"*" names every tool. Answered with POST .../approvals.',
    )
    context: ContextPolicy | None = Field(
        None, description="The context policy; the server's defaults (PARLEY_CONTEXT_*) if omitted or null."
    )
    metadata: Metadata | None = None

    _unique = field_validator("client_tools")(unique_client_tools)


class SessionUpdate(_Strict):
    """Only the fields given change; `title` and `system_prompt` may be null (removed), `model` not."""

    # Null is left out of the spec: a session always has a model (the server answers null with a 422).
    model: str | SkipJsonSchema[None] = Field(None, description=f"{_MODEL} Not null.")
    title: str | None = Field(None, max_length=200)
    system_prompt: str | None = Field(None, max_length=100_000)
    # Null is left out of the spec: a session always has a policy (fields left out keep theirs).
    context: ContextPolicy | SkipJsonSchema[None] = Field(
        None, description="Changes the context policy's given fields, from the next turn on. Not null."
    )
    metadata: Metadata | None = Field(None, description="Replaces the metadata whole; null empties it.")


class SessionOut(BaseModel):
    id: str
    title: str | None = Field(
        description="As given; a session created without one takes the first line of its first message "
        "(at most 80 characters)."
    )
    model: str
    system_prompt: str | None
    tools: list[str]
    client_tools: list[ClientTool]
    approval: list[str]
    status: str
    agent_status: AgentState
    running_turn_id: str | None
    created_at: str
    updated_at: str
    total_tokens: int
    context_used: int
    context_window: int | None
    context: ContextPolicyOut
    metadata: dict[str, str | bool | int | float]


class ContextSummaryOut(BaseModel):
    id: str
    content: str
    summarized_turn_ids: list[str] = Field(description="The turns it replaces, oldest first.")
    model: str = Field(description="The model that wrote it.")
    created_at: str


class SessionContext(BaseModel):
    """What the session's next model call would send with the history as it is (docs/context.md)."""

    policy: ContextPolicyOut
    model: str
    context_window: int | None
    budget_tokens: int | None = Field(description="The window less the reserve; null: the window is unknown.")
    history_tokens: int = Field(description="The estimated prompt of the whole history.")
    sent_tokens: int = Field(description="The estimated prompt of what would be sent.")
    compaction_due: bool = Field(
        description="The history no longer fits as shown: the next call first folds more turns into the "
        "summary."
    )
    summary: ContextSummaryOut | None
    elided_tool_call_ids: list[str]
    elided_file_ids: list[str] = Field(
        description="The attached files (images, documents) that would be sent as a placeholder naming them."
    )
    verbatim_turn_ids: list[str] = Field(description="The turns sent as they are, oldest first.")
    messages: list[dict[str, Any]] = Field(
        description="The prompt in OpenAI chat format: the system message (with the summary) and the "
        "verbatim tail, elided tool results and files as their placeholders; an image or a document that is "
        "sent is shown by its file's URL (/v1/files/{file_id}/content), not its bytes."
    )


class StreamToken(BaseModel):
    token: str = Field(
        description="Opens this session's event stream only, as `?access_token=<token>`, until expires_at."
    )
    expires_at: str


class SessionPage(BaseModel):
    sessions: list[SessionOut]
    next_cursor: str | None = Field(description="Pass as `cursor` to get the next page; null at the end.")


Delivery = Literal["steer", "queue", "interrupt", "reject"]


class MessageCreate(_Strict):
    content: str = Field(
        min_length=1,
        # Stated for the spec; the server's own check (_not_blank) gives the clearer message.
        json_schema_extra={"pattern": r"\S"},
        description="The message, with at least one character that is not whitespace; longer than "
        "PARLEY_MAX_MESSAGE_CHARS: 413.",
    )
    sender: str = Field("User", min_length=1, max_length=100)
    delivery: Delivery = Field(
        "steer",
        description=(
            "What to do when a turn is running. steer: take it at the next breakpoint (after the current "
            "tool round, before the next model call). queue: wait until the turn ends by itself. "
            "interrupt: stop the turn (as POST .../cancel would), then answer this. reject: 409."
        ),
    )
    client_message_id: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        description="The sender's own id for the message, stored and echoed on its user_message events, "
        "in the answer and in the history: the tab that sent it matches its optimistic copy by it.",
    )
    client_tools: list[ClientTool] | None = Field(
        None, max_length=64, description="Client tools offered for the turn that takes this message only."
    )
    attachments: list[AttachmentRef] | None = Field(
        None,
        max_length=MAX_ATTACHMENTS_SCHEMA,
        description="Files for the model (docs/files.md): `{file_id}` of an upload, or `{url}` with a data "
        "URL (stored as a file first). More than PARLEY_FILES_MAX_ATTACHMENTS: 413; a file the session's "
        "model cannot take (an image without vision, a PDF without documents): 422 `unsupported_attachment`, "
        "before anything is stored.",
    )

    _unique = field_validator("client_tools")(unique_client_tools)

    @field_validator("content")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the message is empty")
        return value


class MessageAccepted(BaseModel):
    id: str
    session_id: str
    content: str
    sender: str
    client_message_id: str | None = Field(None, description="As given when the message was posted.")
    timestamp: str
    turn_id: str | None = Field(description="The turn this message started; null while it waits its turn.")
    queued: bool
    delivery: Delivery
    attachments: list[Attachment] = Field(default_factory=list, description="The message's files, as stored.")


class QueuedMessage(BaseModel):
    """A message acknowledged while a turn runs, not yet taken by a turn."""

    id: str
    content: str
    sender: str
    client_message_id: str | None = Field(None, description="As given when the message was posted.")
    timestamp: str
    delivery: Delivery
    # Kept for the turn that takes the message, not shown: the queue's shape is its events' (QueuedItem).
    client_tools: list[ClientTool] | None = Field(None, exclude=True)
    attachments: list[Attachment] | None = Field(None, exclude=True)
    # A note for the model from the frontend (AG-UI's context), joined to the system prompt of the turn
    # that takes the message; stored with it (chat_messages.note), never shown.
    note: str | None = Field(None, exclude=True)


class QueueList(BaseModel):
    queue: list[QueuedMessage]


class CancelRequest(_Strict):
    # Strict: a JSON boolean only; lax coercion took 0, 1, "yes" and "off" for one.
    clear_queue: StrictBool = Field(
        False, description="Also withdraw the waiting messages (returned, so a client can restore its input)."
    )


class CancelResult(BaseModel):
    cancelled: bool = Field(description="False when no turn was running.")
    turn_id: str | None = None
    interrupted_message_ids: list[str] = Field(default_factory=list)
    interrupted_tool_call_ids: list[str] = Field(default_factory=list)
    withdrawn: list[QueuedMessage] = Field(default_factory=list)


class ModelInfo(BaseModel):
    model: str
    provider: str | None
    context_window: int | None
    source: Literal["demo", "models_file", "default"]


class ModelList(BaseModel):
    models: list[ModelInfo]
    default_model: str


# chat_messages, exactly as docs/protocol.md shows them (snake_case), one model per kind.


class TurnStartMessage(BaseModel):
    id: str
    type: Literal["turn_start"] = "turn_start"
    turn_id: str
    timestamp: str


class UserTextMessage(BaseModel):
    id: str
    type: Literal["text"] = "text"
    role: Literal["user"] = "user"
    content: str
    timestamp: str
    sender: str
    client_message_id: str | None = Field(None, description="As given when the message was posted.")
    attachments: list[Attachment] = Field(default_factory=list, description="The message's files (no bytes).")


class AssistantTextMessage(BaseModel):
    id: str
    type: Literal["text"] = "text"
    role: Literal["assistant"] = "assistant"
    content: str
    timestamp: str = Field(description="When the response's first text arrived.")
    duration_ms: int | None = Field(
        description="From the model request to the response's end, the wait for the first token included; "
        "null while it streams or when a stop cut it short."
    )
    first_token_ms: int | None = Field(
        None,
        description="From the model request to the response's first token: the wait part of duration_ms. "
        "Null while it streams, when a stop cut it short, and for texts stored before it was recorded.",
    )
    model: str
    interrupted: bool = Field(False, description="True when a stop cut this text short.")


class ReasoningMessage(BaseModel):
    """The reasoning a model streamed before its answer (docs/protocol.md, reasoning); what the provider
    needs back (a signature, encrypted thinking) is kept by the server and never shown."""

    id: str
    type: Literal["reasoning"] = "reasoning"
    role: Literal["assistant"] = "assistant"
    content: str
    timestamp: str = Field(description="When the response's first reasoning arrived.")
    duration_ms: int | None = Field(
        description="From the model request to the reasoning's end; null while it streams or when a stop "
        "cut it short."
    )
    model: str
    interrupted: bool = Field(False, description="True when a stop cut this reasoning short.")


class ToolGroupMessage(BaseModel):
    id: str
    type: Literal["tool_group"] = "tool_group"
    role: Literal["assistant"] = "assistant"
    tool_call_id: str
    tool_name: str
    arguments: Any
    result: str | None = Field(description="Null while the tool runs.")
    is_error: bool | None
    timestamp: str
    duration_ms: int | None = Field(description="The execution (a client tool's: until its result came).")
    model: str
    interrupted: bool = Field(
        False, description="True when a stop, a failure or a restart cut the call short."
    )
    source: str | None = Field(
        None,
        description="Who ran the tool: `builtin`, `mcp`, `http` or `client`; null for a call never started.",
    )
    truncated: bool = Field(False, description="The result was cut to its cap, with a marker for the model.")
    executed_by: Literal["server", "client"] = Field("server", description="Who ran the call.")
    decision: Literal["approve", "edit", "reject", "expired", "interrupted"] | None = Field(
        None, description="The person's decision, when the call waited for approval."
    )
    wait_ms: int | None = Field(
        None, description="Time spent waiting for the person (approval), apart from duration_ms."
    )


class TurnDoneMessage(BaseModel):
    id: str
    type: Literal["turn_done"] = "turn_done"
    turn_id: str
    timestamp: str
    duration_seconds: float
    status: TurnStatus


class ErrorMessage(BaseModel):
    id: str
    type: Literal["error"] = "error"
    role: Literal["assistant"] = "assistant"
    content: str
    code: str
    timestamp: str
    model: str | None


ChatMessage = (
    TurnStartMessage
    | UserTextMessage
    | AssistantTextMessage
    | ReasoningMessage
    | ToolGroupMessage
    | TurnDoneMessage
    | ErrorMessage
)


class MessagePage(BaseModel):
    chat_messages: list[ChatMessage]
    next_cursor: str | None = Field(
        description="Pass as `after` (or `before`, when paging backwards) for the next page; null at the end."
    )
    last_event_id: int = Field(
        description="The stream position this history includes: subscribe with after=last_event_id."
    )


class ErrorBody(BaseModel):
    code: str = Field(description="Stable, machine-readable: e.g. not_found, validation_error, turn_running.")
    message: str = Field(description="For people; never a stack trace.")
    details: Any = None
    request_id: str = Field(description="Also in the X-Request-ID header and the server's log.")


class ErrorResponse(BaseModel):
    error: ErrorBody
