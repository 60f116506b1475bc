"""The event stream's wire protocol: one frozen model per event type, discriminated on `type`.

A turn emits, in order: turn_start, user_message, agent_status(thinking), then per model response
context_compacted (when what the call sends differs from the history and from what the turn sent
before), text_delta... (the first one carries timestamp and model), response_done, token_usage, and per
tool call tool_exec_start, agent_status(tool_calling), tool_exec_end, agent_status(thinking); it ends with
agent_status(idle) and turn_done. A call that waits for the client (a client tool) or for a person
(approval) adds client_tool_requested or approval_requested after its tool_exec_start and
agent_status(awaiting_input); its answer (or expiry, or a stop) adds client_tool_resolved or
approval_resolved, before the call's tool_exec_end. A stop adds agent_cancelled; a failure adds error
before turn_done.
Outside turns: user_message (queued) and queue_updated when messages wait, and resync as the first frame
of a stream whose asked-for position is gone. branch_changed when the active path changes: after a
regenerated or edited turn's turn_start and user_message, or alone when a branch is activated.
Every event carries `seq` (the SSE `id:`, +1 per event within the session) and `session_id`.

One frame is not part of the log: `resync`, sent first on a stream whose asked-for position can no
longer be replayed. It takes no sequence number; its `seq` repeats the last event's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from app.protocol.files import Attachment

TurnStatus = Literal["completed", "cancelled", "failed", "interrupted"]
AgentState = Literal["idle", "thinking", "tool_calling", "awaiting_input"]
# Who runs a tool: the service itself, an MCP server, an HTTP endpoint, or the client (the browser).
ToolSource = Literal["builtin", "mcp", "http", "client"]
_SOURCE = (
    "Who runs the tool: `builtin` (the service), `mcp` (an MCP server), `http` (an HTTP tool) or `client`."
)
Decision = Literal["approve", "edit", "reject"]


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True)

    type: str
    seq: int = Field(description="Position in the session's stream; equals the SSE id.")
    session_id: str


class TurnStart(_Event):
    type: Literal["turn_start"] = "turn_start"
    id: str = Field(description="The turn_start chat message id.")
    turn_id: str
    timestamp: str


class UserMessage(_Event):
    type: Literal["user_message"] = "user_message"
    id: str
    text: str
    timestamp: str
    turn_id: str | None = Field(description="The turn that took the message; null while it waits.")
    model: str = Field(description="The model that will answer it.")
    sender: str
    queued: bool = Field(False, description="True when announced while another turn runs.")
    client_message_id: str | None = Field(
        None, description="The sender's own id of the message: its tab matches its optimistic copy by it."
    )
    attachments: list[Attachment] = Field(
        default_factory=list, description="The message's files (docs/files.md), never their bytes."
    )


def clean_text(text: str) -> str:
    """Model text as valid Unicode: a lone surrogate (JSON allows the escape) becomes U+FFFD."""
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in text)
    return text


def _first_delta_only(data: dict[str, Any]) -> dict[str, Any]:
    """A streamed message's `timestamp` and `model` go on its first delta only; later ones leave them out."""
    if data.get("timestamp") is None:
        data.pop("timestamp", None)
        data.pop("model", None)
    return data


class TextDelta(_Event):
    type: Literal["text_delta"] = "text_delta"
    id: str = Field(description="The assistant text chat message this delta belongs to.")
    text: str
    timestamp: str | None = Field(None, description="Only on the first delta of a message.")
    model: str | None = Field(None, description="Only on the first delta of a message.")

    @model_serializer(mode="wrap")
    def _drop_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _first_delta_only(handler(self))


class ReasoningDelta(_Event):
    """A piece of the reasoning the model streams before its answer (Anthropic thinking, DeepSeek's and
    Qwen's reasoning_content): shown as a collapsible block, never part of the answer."""

    type: Literal["reasoning_delta"] = "reasoning_delta"
    id: str = Field(description="The reasoning chat message this delta belongs to.")
    text: str
    timestamp: str | None = Field(None, description="Only on the first delta of a message.")
    model: str | None = Field(None, description="Only on the first delta of a message.")

    @model_serializer(mode="wrap")
    def _drop_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _first_delta_only(handler(self))


class Usage(BaseModel):
    model_config = ConfigDict(frozen=True)

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    estimated: bool = Field(
        False, description="Estimated by the server: the provider sent no usage for this response."
    )
    cache_read_tokens: int = Field(
        0,
        description="Of prompt_tokens, those read from the provider's prompt cache (0: none reported).",
    )
    cache_write_tokens: int = Field(
        0,
        description="Of prompt_tokens, those written to the provider's prompt cache (0: none reported).",
    )
    reasoning_tokens: int | None = Field(
        None,
        description="Of completion_tokens, the model's reasoning (null where the provider does not count "
        "them apart).",
    )


class ResponseInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    model: str
    finish_reason: str | None
    usage: Usage | None


class ResponseDone(_Event):
    """A model response ended. Its times run from the model request (the last attempt's): `duration_ms` to
    the response's end, `first_token_ms` to its first token, so the wait before the answer began is
    `first_token_ms` and the streaming `duration_ms - first_token_ms`. The assistant text's history
    entry keeps both."""

    type: Literal["response_done"] = "response_done"
    id: str | None = Field(description="The assistant text message of this response; null if it had no text.")
    duration_ms: int = Field(
        description="From the model request to the response's end, the wait for the first token included "
        "(the last attempt's, when a provider error before any output was retried)."
    )
    first_token_ms: int | None = Field(
        None,
        description="From the model request to the response's first token (text or tool call): the wait "
        "part of duration_ms. Null when the response streamed neither.",
    )
    response: ResponseInfo


class ToolCall(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: Any = Field(description="The parsed JSON arguments, or the raw text when it was not JSON.")


class ToolExecStart(_Event):
    type: Literal["tool_exec_start"] = "tool_exec_start"
    id: str = Field(description="The tool_group chat message id.")
    tool_call: ToolCall
    timestamp: str
    model: str
    source: ToolSource = Field(description=_SOURCE)


class ToolResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    tool_call_id: str
    content: str
    is_error: bool


class ToolExecEnd(_Event):
    type: Literal["tool_exec_end"] = "tool_exec_end"
    id: str
    tool_result: ToolResult
    timestamp: str
    duration_ms: int = Field(description="Measured by the server.")
    source: ToolSource = Field(description=_SOURCE)
    truncated: bool = Field(
        description="The result was longer than its cap and was cut, with a marker the model reads."
    )


class TurnDone(_Event):
    type: Literal["turn_done"] = "turn_done"
    id: str = Field(description="The turn_done chat message id.")
    turn_id: str
    timestamp: str
    duration_seconds: float
    status: TurnStatus


class AgentStatus(_Event):
    type: Literal["agent_status"] = "agent_status"
    status: AgentState
    tool_name: str | None = None
    turn_id: str | None = None


class TokenUsage(_Event):
    type: Literal["token_usage"] = "token_usage"
    context_used: int = Field(description="Prompt tokens of the latest response: the context's size.")
    context_window: int | None
    context_percent: float | None = Field(description="Null when the context window is unknown.")
    session_total_tokens: int
    model: str
    estimated: bool = Field(
        False, description="The latest response's usage was counted by LiteLLM's tokenizer (no usage sent)."
    )
    cache_read_tokens: int = Field(
        0,
        description="Of context_used, the tokens the latest response read from the provider's prompt cache.",
    )
    cache_write_tokens: int = Field(
        0, description="Of context_used, the tokens the latest response wrote to the provider's prompt cache."
    )


class ContextCompacted(_Event):
    """The next model call sends a compacted view of the history (docs/context.md); the history itself is
    unchanged."""

    type: Literal["context_compacted"] = "context_compacted"
    turn_id: str
    tokens_before: int = Field(description="The estimated prompt of the whole history, in tokens.")
    tokens_after: int = Field(description="The estimated prompt the call sends.")
    summarized_turn_ids: list[str] = Field(description="The turns the summary replaces, oldest first.")
    elided_tool_call_ids: list[str] = Field(
        description="Tool calls whose results are sent as a placeholder (the call itself is kept)."
    )
    elided_file_ids: list[str] = Field(
        description="Attached files (images, documents) sent as a placeholder that names them, oldest first."
    )
    summary_id: str | None = Field(description="The summary sent (GET .../context shows it); null: none.")
    summary_written: bool = Field(description="The summary was written for this call.")


class AgentCancelled(_Event):
    type: Literal["agent_cancelled"] = "agent_cancelled"
    turn_id: str
    interrupted_message_ids: list[str]
    interrupted_tool_call_ids: list[str]


class ClientToolRequested(_Event):
    """The model called a client tool: the client runs it and posts its result to .../tool_results."""

    type: Literal["client_tool_requested"] = "client_tool_requested"
    id: str = Field(description="The tool_group chat message id.")
    turn_id: str
    tool_call_id: str
    name: str
    arguments: Any
    expires_at: str = Field(description="After this the model reads a timeout error and a result gets 410.")


class ApprovalRequested(_Event):
    """A call waits for a person's decision, posted to .../approvals."""

    type: Literal["approval_requested"] = "approval_requested"
    id: str = Field(description="The tool_group chat message id.")
    turn_id: str
    tool_call_id: str
    name: str
    arguments: Any
    expires_at: str = Field(description="After this the call is rejected with 'approval timed out'.")
    decisions: list[Decision] = Field(description="The decisions allowed for this call.")


class ClientToolResolved(_Event):
    type: Literal["client_tool_resolved"] = "client_tool_resolved"
    id: str = Field(description="The tool_group chat message id.")
    turn_id: str
    tool_call_id: str
    resolution: Literal["answered", "expired", "interrupted"]
    is_error: bool
    wait_ms: int = Field(description="From the request to its resolution.")


class ApprovalResolved(_Event):
    type: Literal["approval_resolved"] = "approval_resolved"
    id: str = Field(description="The tool_group chat message id.")
    turn_id: str
    tool_call_id: str
    decision: Literal["approve", "edit", "reject", "expired", "interrupted"]
    arguments: Any = Field(description="The arguments the call runs with (the edited ones after an edit).")
    reason: str | None = None
    wait_ms: int = Field(description="Time spent waiting for the person, apart from the execution.")


class QueuedItem(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    content: str
    sender: str
    client_message_id: str | None = None
    timestamp: str
    delivery: str


class QueueUpdated(_Event):
    type: Literal["queue_updated"] = "queue_updated"
    queue: list[QueuedItem] = Field(description="Every message still waiting for a turn, in order.")


class BranchChanged(_Event):
    """The session's active path changed (regenerate, edit, activate): reload the history and turns."""

    type: Literal["branch_changed"] = "branch_changed"
    head_turn_id: str = Field(description="The active path's last turn.")
    path_turn_ids: list[str] = Field(description="The active path's turn ids, first turn first.")


class ErrorEvent(_Event):
    type: Literal["error"] = "error"
    id: str = Field(description="The error chat message id.")
    message: str
    code: str
    model: str | None = None
    timestamp: str
    trace_id: str | None = Field(
        None, description="The turn's OpenTelemetry trace id when tracing is on: follow it in the traces."
    )
    retry_after: float | None = Field(
        None,
        description="Seconds the model provider asked to wait before trying again (its Retry-After), when "
        "it said: a rate limit or an overload longer than the server waits out itself.",
    )


class Resync(_Event):
    """The asked-for position cannot be replayed: reload the history, then continue from this frame."""

    type: Literal["resync"] = "resync"
    seq: int = Field(description="Equals last_event_id: a resync is not logged and takes no seq of its own.")
    last_event_id: int = Field(
        description="The session's last event: the stream goes on after it, and a reconnect resumes from it."
    )
    reason: Literal["expired", "unknown"] = Field(
        description="expired: older than the kept log (retention); unknown: newer than any event the server "
        "has, e.g. after the database was restored."
    )


Event = Annotated[
    TurnStart
    | UserMessage
    | ReasoningDelta
    | TextDelta
    | ResponseDone
    | ToolExecStart
    | ToolExecEnd
    | TurnDone
    | AgentStatus
    | TokenUsage
    | ContextCompacted
    | AgentCancelled
    | QueueUpdated
    | BranchChanged
    | ErrorEvent
    | ClientToolRequested
    | ApprovalRequested
    | ClientToolResolved
    | ApprovalResolved
    | Resync,
    Field(discriminator="type"),
]
