"""The turn view: a session's chat_messages grouped by turn, as seed 002 groups a message with its nodes.

A turn has its user input, its ordered nodes (each model text and each tool call, with its final
content, model or tool name, timing and metadata), its status and times, and its final answer: the
turn's last assistant text. Only final content exists to group: streamed text is stored as one message
per model response, never once per delta (seed 002's chunk rule), so a node is never a chunk.

With `?wait=true` a script gets a turn once it has ended: the turn that takes a message it posts
(`post_and_wait`), or a turn it knows by id (`wait_turn`), read after its turn_done has committed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from app.chat.service import ChatService, InvalidCursor, to_chat_message
from app.errors import NotFound
from app.protocol.events import TurnStatus
from app.protocol.schemas import (
    AssistantTextMessage,
    ChatMessage,
    ErrorMessage,
    MessageCreate,
    ToolGroupMessage,
    TurnDoneMessage,
    TurnStartMessage,
    UserTextMessage,
)
from app.storage import turn_queries
from app.storage.engine import Database
from app.storage.tables import ChatMessageRow


class TurnInput(BaseModel):
    """A user message the turn answered (several when messages waited together)."""

    id: str
    content: str
    sender: str
    client_message_id: str | None = Field(None, description="As given when the message was posted.")
    timestamp: str


class LlmNode(BaseModel):
    """One model response's text, as stored at its end (or at the stop that cut it short)."""

    kind: Literal["llm"]
    id: str = Field(description="The assistant text chat message.")
    content: str
    model: str
    timestamp: str = Field(description="When the first text of the response arrived.")
    duration_ms: int | None = Field(
        description="From the first text to the response's end; null while it streams."
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


TurnNode = Annotated[LlmNode | ToolNode, Field(discriminator="kind")]


class TurnError(BaseModel):
    id: str = Field(description="The error chat message.")
    code: str
    message: str
    timestamp: str


class Turn(BaseModel):
    turn_id: str
    status: Literal["running", TurnStatus]
    started_at: str
    ended_at: str | None = Field(description="Null while the turn runs.")
    duration_seconds: float | None = Field(description="Null while the turn runs.")
    user_messages: list[TurnInput]
    nodes: list[TurnNode] = Field(description="Model texts and tool calls in the order they happened.")
    final_answer: str | None = Field(description="The turn's last assistant text; null if it has none.")
    error: TurnError | None = Field(description="Why the turn failed; null unless it did.")


class TurnPage(BaseModel):
    turns: list[Turn] = Field(description="Oldest first.")
    next_cursor: str | None = Field(
        description="The oldest turn's id when older turns exist: pass it as `before`; null at the start."
    )


# --- use cases -----------------------------------------------------------------------------------------


async def list_turns(
    database: Database,
    chat: ChatService,
    principal: str,
    session_id: str,
    *,
    limit: int,
    before: str | None,
) -> TurnPage:
    """The session's `limit` newest turns, or the ones just before the turn `before`."""
    await chat.get_row(principal, session_id)
    async with database.session() as db:
        before_position = None
        if before is not None:
            before_position = await turn_queries.turn_position(db, session_id, before)
            if before_position is None:
                raise InvalidCursor(f"No turn {before!r} in this session.", details={"cursor": before})
        turn_ids = await turn_queries.latest_turn_ids(
            db, session_id, limit=limit + 1, before_position=before_position
        )
        rows = await turn_queries.messages_of_turns(db, session_id, turn_ids[:limit])
    turns = build_turns(rows)
    more = len(turn_ids) > limit
    return TurnPage(turns=turns, next_cursor=turns[0].turn_id if more and turns else None)


async def get_turn(
    database: Database, chat: ChatService, principal: str, session_id: str, turn_id: str
) -> Turn:
    await chat.get_row(principal, session_id)
    async with database.session() as db:
        rows = await turn_queries.messages_of_turns(db, session_id, [turn_id])
    if not rows:
        raise NotFound(
            f"No turn {turn_id!r} in session {session_id!r}.",
            details={"session_id": session_id, "turn_id": turn_id},
        )
    return build_turns(rows)[0]


async def post_and_wait(
    database: Database,
    chat: ChatService,
    principal: str,
    session_id: str,
    body: MessageCreate,
    *,
    idempotency_key: str | None,
    timeout: float | None,
) -> tuple[Turn, bool]:
    """Stores the message as a plain post does, then waits for the end of the turn that takes it.

    Returns that turn, and whether the message is an idempotent replay (a retry then waits for the same
    message's turn). Cancelling this while the message is stored finishes the storing anyway.
    """
    accepted, replayed = await asyncio.shield(
        chat.post_message(principal, session_id, body, idempotency_key=idempotency_key)
    )
    turn_id = await chat.await_message_turn(principal, session_id, accepted, timeout)
    return await get_turn(database, chat, principal, session_id, turn_id), replayed


async def wait_turn(
    database: Database,
    chat: ChatService,
    principal: str,
    session_id: str,
    turn_id: str,
    *,
    timeout: float | None,
) -> Turn:
    """The turn once it has ended (at once when it already has); 504 if the limit passes first."""
    turn = await get_turn(database, chat, principal, session_id, turn_id)
    if turn.status != "running":
        return turn
    await chat.await_turn_end(turn_id, timeout)
    return await get_turn(database, chat, principal, session_id, turn_id)


# --- grouping ------------------------------------------------------------------------------------------


def build_turns(rows: Iterable[ChatMessageRow]) -> list[Turn]:
    """Groups rows in history order into turns, in the order the turns started."""
    groups: dict[str, list[ChatMessage]] = {}
    for row in rows:
        groups.setdefault(row.turn_id, []).append(to_chat_message(row))
    return [_turn(turn_id, messages) for turn_id, messages in groups.items()]


def _turn(turn_id: str, messages: Sequence[ChatMessage]) -> Turn:
    started_at = messages[0].timestamp
    done: TurnDoneMessage | None = None
    error: TurnError | None = None
    inputs: list[TurnInput] = []
    nodes: list[LlmNode | ToolNode] = []
    for message in messages:
        match message:
            case TurnStartMessage():
                started_at = message.timestamp
            case UserTextMessage():
                inputs.append(
                    TurnInput(
                        id=message.id,
                        content=message.content,
                        sender=message.sender,
                        client_message_id=message.client_message_id,
                        timestamp=message.timestamp,
                    )
                )
            case AssistantTextMessage():
                nodes.append(_llm(message))
            case ToolGroupMessage():
                nodes.append(_tool(message))
            case ErrorMessage():
                error = TurnError(
                    id=message.id, code=message.code, message=message.content, timestamp=message.timestamp
                )
            case TurnDoneMessage():
                done = message
    answers = [node.content for node in nodes if isinstance(node, LlmNode)]
    return Turn(
        turn_id=turn_id,
        status=done.status if done else "running",
        started_at=started_at,
        ended_at=done.timestamp if done else None,
        duration_seconds=done.duration_seconds if done else None,
        user_messages=inputs,
        nodes=nodes,
        final_answer=answers[-1] if answers else None,
        error=error,
    )


def _llm(message: AssistantTextMessage) -> LlmNode:
    return LlmNode(
        kind="llm",
        id=message.id,
        content=message.content,
        model=message.model,
        timestamp=message.timestamp,
        duration_ms=message.duration_ms,
        interrupted=message.interrupted,
    )


def _tool(message: ToolGroupMessage) -> ToolNode:
    return ToolNode(
        kind="tool",
        id=message.id,
        tool_call_id=message.tool_call_id,
        tool_name=message.tool_name,
        arguments=message.arguments,
        result=message.result,
        is_error=message.is_error,
        model=message.model,
        timestamp=message.timestamp,
        duration_ms=message.duration_ms,
        interrupted=message.interrupted,
    )
