"""The turn view's REST schemas: a session's chat_messages grouped by turn, a turn with its nodes
(docs/protocol.md, Turns) (GET /v1/sessions/{session_id}/turns)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from app.protocol.events import TurnStatus
from app.protocol.files import Attachment


class TurnInput(BaseModel):
    """A user message the turn answered (several when messages waited together)."""

    id: str
    content: str
    sender: str
    client_message_id: str | None = Field(None, description="As given when the message was posted.")
    timestamp: str
    attachments: list[Attachment] = Field(default_factory=list, description="The message's files (no bytes).")


class LlmNode(BaseModel):
    """One model response's text, as stored at its end (or at the stop that cut it short)."""

    kind: Literal["llm"]
    id: str = Field(description="The assistant text chat message.")
    content: str
    model: str
    timestamp: str = Field(description="When the first text of the response arrived.")
    duration_ms: int | None = Field(
        description="From the model request to the response's end, the wait for the first token included; "
        "null while it streams or when a stop cut it short."
    )
    first_token_ms: int | None = Field(
        None,
        description="From the model request to the response's first token: the wait part of duration_ms.",
    )
    interrupted: bool


class ReasoningNode(BaseModel):
    """The reasoning a model response streamed before its text or tool calls."""

    kind: Literal["reasoning"]
    id: str = Field(description="The reasoning chat message.")
    content: str
    model: str
    timestamp: str = Field(description="When the first reasoning of the response arrived.")
    duration_ms: int | None = Field(
        description="From the model request to the reasoning's end; null while it streams or when a stop "
        "cut it short."
    )
    interrupted: bool


class ToolNode(BaseModel):
    """One tool call with its result and the server-measured execution time."""

    kind: Literal["tool"]
    id: str = Field(description="The tool_group chat message.")
    tool_call_id: str
    tool_name: str
    arguments: Any
    result: str | None = Field(description="Null while the tool runs.")
    is_error: bool | None
    model: str = Field(description="The model that asked for the call.")
    timestamp: str = Field(description="When the tool started.")
    duration_ms: int | None = Field(description="Null while the tool runs or when a stop cut it short.")
    interrupted: bool = Field(description="A stop, a failure or a restart ended the call before its result.")


TurnNode = Annotated[LlmNode | ReasoningNode | ToolNode, Field(discriminator="kind")]


class TurnError(BaseModel):
    id: str = Field(description="The error chat message.")
    code: str
    message: str
    timestamp: str


class TurnCompaction(BaseModel):
    """What the turn's model calls sent instead of the whole history (docs/context.md)."""

    calls: int = Field(description="The turn's model calls that sent a compacted view.")
    summary_id: str | None = Field(description="The summary the last of them sent; null: none.")
    summarized_turn_ids: list[str] = Field(description="The turns that summary replaces, oldest first.")
    elided_tool_call_ids: list[str] = Field(
        description="Every call whose result one of them sent as a placeholder."
    )
    elided_file_ids: list[str] = Field(description="Every attached file one of them sent as a placeholder.")
    tokens_before: int = Field(description="The last one's estimate of the whole history, in tokens.")
    tokens_after: int = Field(description="The last one's estimate of what it sent.")


class Turn(BaseModel):
    turn_id: str
    status: Literal["running", TurnStatus]
    started_at: str
    ended_at: str | None = Field(description="Null while the turn runs.")
    duration_seconds: float | None = Field(description="Null while the turn runs.")
    user_messages: list[TurnInput]
    nodes: list[TurnNode] = Field(
        description="Model reasoning, texts and tool calls in the order they happened."
    )
    final_answer: str | None = Field(description="The turn's last assistant text; null if it has none.")
    error: TurnError | None = Field(description="Why the turn failed; null unless it did.")
    parent_turn_id: str | None = Field(
        description="The turn this one follows (docs/protocol.md, Branches); null for a first turn."
    )
    siblings: list[str] = Field(
        description="The turn ids of the turns with the same parent, this one included, oldest first: the "
        "answers and edits a '< i/n >' control steps through."
    )
    sibling_index: int = Field(description="This turn's place in `siblings`, from 0.")
    compaction: TurnCompaction | None = Field(
        None, description="What its model calls sent instead of the whole history; null: the whole history."
    )


class TurnPage(BaseModel):
    turns: list[Turn] = Field(description="Oldest first.")
    next_cursor: str | None = Field(
        description="The oldest turn's id when older turns exist: pass it as `before`; null at the start."
    )
