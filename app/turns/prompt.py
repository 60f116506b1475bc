"""Rebuilds the LLM history (OpenAI chat format, as LiteLLM takes it) from chat_messages
(docs/protocol.md, The prompt a model reads).

user text → user message (consecutive ones merged into one), its attachments as content parts (filled in
with the files' bytes by turns.attachments); an assistant text and the tool_groups of
the same model response → one assistant message with `tool_calls`, followed by one role "tool" message
per result; a reasoning row's signed or redacted blocks (Anthropic's) → that message's `thinking_blocks`,
which the Anthropic reader sends first and no other reader sends (reasoning without them never goes
back); turn markers and errors are skipped: they never reach the model.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from app.storage.tables import ChatMessageRow
from app.turns.agent import arguments_text

INTERRUPTED_MARK = "[interrupted]"
# A user message's attached file, as `rebuild` leaves it for turns.attachments to fill in.
FILE_PART = "parley_file"
TOOL_INTERRUPTED = "[Tool execution interrupted]"


def rebuild(
    rows: Iterable[ChatMessageRow],
    system_prompt: str | None,
    turns: list[tuple[str, ...]] | None = None,
) -> list[dict[str, Any]]:
    """The prompt; `turns`, when given, is filled with each message's turns, aligned with the prompt (a
    user message merged from several turns names them all): the context planner cuts the history by
    them (turns.context)."""
    messages: list[dict[str, Any]] = []
    owners: list[tuple[str, ...]] = turns if turns is not None else []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
        owners.append(())
    assistant: dict[str, Any] | None = None
    results: list[dict[str, Any]] = []
    response_id: str | None = None
    response_turn = ""
    thinking: dict[str | None, list[dict[str, Any]]] = {}

    def close_response() -> None:
        nonlocal assistant, results, response_id
        if assistant is not None:
            messages.append(assistant)
            messages.extend(results)
            owners.extend([(response_turn,)] * (1 + len(results)))
        assistant, results, response_id = None, [], None

    for row in rows:
        if row.type == "text" and row.role == "user":
            close_response()
            _add_user(messages, owners, row)
        elif row.type == "reasoning":
            # Comes before its response's text and calls; goes back only with them (a reasoning alone,
            # its response cut short or failed, would be an empty assistant message).
            kept = _kept_thinking(row)
            if kept:
                thinking[row.response_id] = kept
        elif row.type in ("text", "tool_group"):
            if assistant is None or row.response_id != response_id:
                close_response()
                assistant = {"role": "assistant", "content": None}
                response_id, response_turn = row.response_id, row.turn_id
                if response_id in thinking:
                    assistant["thinking_blocks"] = thinking.pop(response_id)
            _add_to_response(assistant, results, row)
    close_response()
    return messages


def _add_user(messages: list[dict[str, Any]], owners: list[tuple[str, ...]], row: ChatMessageRow) -> None:
    previous = messages[-1] if messages else None
    content = _user_content(row)
    if previous is not None and previous["role"] == "user":
        # Several waiting messages taken together, or a turn that failed before the model answered: one
        # user turn, since strict providers refuse two in a row.
        previous["content"] = _joined(previous["content"], content)
        if row.turn_id not in owners[-1]:
            owners[-1] = (*owners[-1], row.turn_id)
    else:
        messages.append({"role": "user", "content": content})
        owners.append((row.turn_id,))


def _user_content(row: ChatMessageRow) -> str | list[dict[str, Any]]:
    """A user message's text, or its text and a FILE_PART per attachment (turns.attachments replaces them
    with the model's own parts before any model reads them)."""
    text = row.content or ""
    if not row.attachments:
        return text
    return [{"type": "text", "text": text}, *({"type": FILE_PART, "file": a} for a in row.attachments)]


def _joined(
    first: str | list[dict[str, Any]], second: str | list[dict[str, Any]]
) -> str | list[dict[str, Any]]:
    if isinstance(first, str) and isinstance(second, str):
        return f"{first}\n\n{second}"
    return _parts(first) + _parts(second)


def _parts(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _add_to_response(assistant: dict[str, Any], results: list[dict[str, Any]], row: ChatMessageRow) -> None:
    """A text row as the assistant message's content, a tool_group as one of its calls and a result."""
    if row.type == "text":
        text = row.content or ""
        if row.interrupted:
            text = f"{text}\n\n{INTERRUPTED_MARK}" if text else INTERRUPTED_MARK
        assistant["content"] = text
        return
    assistant.setdefault("tool_calls", []).append(
        {
            "id": row.tool_call_id,
            "type": "function",
            "function": {"name": row.tool_name, "arguments": arguments_text(row.arguments)},
        }
    )
    results.append(
        {
            "role": "tool",
            "tool_call_id": row.tool_call_id,
            "content": row.result if row.result is not None else TOOL_INTERRUPTED,
        }
    )


def _kept_thinking(row: ChatMessageRow) -> list[dict[str, Any]] | None:
    """The provider's signed or redacted blocks of a reasoning row; none for a reasoning a stop cut short
    or one of a provider that takes none back."""
    kept = row.arguments.get("thinking_blocks") if isinstance(row.arguments, dict) else None
    return list(kept) if kept and not row.interrupted else None
