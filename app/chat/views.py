"""Stored rows as clients read them: chat_messages (docs/protocol.md) and turns grouped from them.

A turn has its user input, its ordered nodes (each model reasoning, text and tool call, with its final
content, model or tool name, timing and metadata), its status and times, and its final answer: the
turn's last assistant text. Only final content exists to group: streamed text is stored as one message
per model response, never once per delta (docs/protocol.md, Turns), so a node is never a chunk.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from app.protocol.schemas import (
    AssistantTextMessage,
    ChatMessage,
    ErrorMessage,
    ReasoningMessage,
    ToolGroupMessage,
    TurnDoneMessage,
    TurnStartMessage,
    UserTextMessage,
)
from app.protocol.turns import (
    LlmNode,
    ReasoningNode,
    ToolNode,
    Turn,
    TurnCompaction,
    TurnError,
    TurnInput,
)
from app.storage.tables import ChatMessageRow, ContextViewRow


def to_chat_message(row: ChatMessageRow) -> ChatMessage:
    if row.type == "turn_start":
        return TurnStartMessage(id=row.id, turn_id=row.turn_id, timestamp=row.timestamp)
    if row.type == "turn_done":
        return TurnDoneMessage(
            id=row.id,
            turn_id=row.turn_id,
            timestamp=row.timestamp,
            duration_seconds=row.duration_seconds or 0.0,
            status=row.status or "completed",
        )
    if row.type == "tool_group":
        return ToolGroupMessage(
            id=row.id,
            tool_call_id=row.tool_call_id or "",
            tool_name=row.tool_name or "",
            arguments=row.arguments,
            result=row.result,
            is_error=row.is_error,
            timestamp=row.timestamp,
            duration_ms=row.duration_ms,
            model=row.model or "",
            interrupted=bool(row.interrupted),
            source=row.source,
            truncated=bool(row.truncated),
            executed_by="client" if row.executed_by == "client" else "server",
            decision=row.decision,
            wait_ms=row.wait_ms,
        )
    if row.type == "reasoning":  # its `arguments` (what the provider needs back) are never shown
        return ReasoningMessage(
            id=row.id,
            content=row.content or "",
            timestamp=row.timestamp,
            duration_ms=row.duration_ms,
            model=row.model or "",
            interrupted=bool(row.interrupted),
        )
    if row.type == "error":
        return ErrorMessage(
            id=row.id,
            content=row.content or "",
            code=row.code or "error",
            timestamp=row.timestamp,
            model=row.model,
        )
    if row.role == "user":
        return UserTextMessage(
            id=row.id,
            content=row.content or "",
            timestamp=row.timestamp,
            sender=row.sender or "User",
            client_message_id=row.client_message_id,
            attachments=row.attachments or [],
        )
    return AssistantTextMessage(
        id=row.id,
        content=row.content or "",
        timestamp=row.timestamp,
        duration_ms=row.duration_ms,
        first_token_ms=row.first_token_ms,
        model=row.model or "",
        interrupted=bool(row.interrupted),
    )


def build_turns(
    rows: Iterable[ChatMessageRow],
    children: Mapping[str | None, list[str]] | None = None,
    views: Iterable[ContextViewRow] = (),
) -> list[Turn]:
    """Groups rows in history order into turns, in the order the turns started. `children` holds the
    turns under each parent (storage.turn_tree.siblings): each turn's siblings come from it (without it,
    a turn is its parent's only child); `views`: what the turns' compacted model calls sent
    (turns.context), in order."""
    groups: dict[str, list[ChatMessage]] = {}
    parents: dict[str, str | None] = {}
    for row in rows:
        groups.setdefault(row.turn_id, []).append(to_chat_message(row))
        if row.type == "turn_start":
            parents[row.turn_id] = row.parent_turn_id
    sent: dict[str, list[ContextViewRow]] = {}
    for view in views:
        sent.setdefault(view.turn_id, []).append(view)
    turns = []
    for turn_id, messages in groups.items():
        parent = parents.get(turn_id)
        siblings = (children or {}).get(parent) or [turn_id]
        if turn_id not in siblings:
            siblings = [*siblings, turn_id]
        turn = _turn(turn_id, messages, parent, siblings)
        turns.append(turn.model_copy(update={"compaction": _compaction(sent.get(turn_id, []))}))
    return turns


def _compaction(views: Sequence[ContextViewRow]) -> TurnCompaction | None:
    if not views:
        return None
    last = views[-1]
    elided = list(dict.fromkeys(call for view in views for call in view.elided_tool_call_ids))
    files = list(dict.fromkeys(file for view in views for file in view.elided_file_ids))
    return TurnCompaction(
        calls=len(views),
        summary_id=last.summary_id,
        summarized_turn_ids=list(last.summarized_turn_ids),
        elided_tool_call_ids=elided,
        elided_file_ids=files,
        tokens_before=last.tokens_before,
        tokens_after=last.tokens_after,
    )


def parents_of(rows: Iterable[ChatMessageRow]) -> set[str | None]:
    """The parent turns of the turns whose turn_start is among `rows`."""
    return {row.parent_turn_id for row in rows if row.type == "turn_start"}


def _turn(turn_id: str, messages: Sequence[ChatMessage], parent: str | None, siblings: list[str]) -> Turn:
    started_at = messages[0].timestamp
    done: TurnDoneMessage | None = None
    error: TurnError | None = None
    inputs: list[TurnInput] = []
    nodes: list[LlmNode | ReasoningNode | ToolNode] = []
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
                        attachments=message.attachments,
                    )
                )
            case AssistantTextMessage():
                nodes.append(_llm(message))
            case ReasoningMessage():
                nodes.append(
                    ReasoningNode(
                        kind="reasoning",
                        id=message.id,
                        content=message.content,
                        model=message.model,
                        timestamp=message.timestamp,
                        duration_ms=message.duration_ms,
                        interrupted=message.interrupted,
                    )
                )
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
        parent_turn_id=parent,
        siblings=siblings,
        sibling_index=siblings.index(turn_id),
    )


def _llm(message: AssistantTextMessage) -> LlmNode:
    return LlmNode(
        kind="llm",
        id=message.id,
        content=message.content,
        model=message.model,
        timestamp=message.timestamp,
        duration_ms=message.duration_ms,
        first_token_ms=message.first_token_ms,
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
