"""Parley's event stream as the AI SDK's UI message stream (protocol v1), and its history as `UIMessage`s.

A thin translation: a turn is one assistant message (its id is the turn's), each model call a step, and
Parley's events map one by one to the chunks of docs/adapters.md. Parley's extras (agent status, usage,
the queue, approvals, the session) go out as transient `data-parley-*` parts, which the kit hands to
`onData` without putting them in the message; from major 6 an approval is also the kit's own
`tool-approval-request`, answered by its next request."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from sse_starlette import ServerSentEvent

from app.chat.kit_chats import KitChats, TurnFeed
from app.errors import NotFound
from app.protocol.ai_sdk import FINISH_REASONS, ChatRequest, UIPart, UserUIMessage, knows_chunk
from app.protocol.files import Attachment
from app.protocol.schemas import (
    AssistantTextMessage,
    ChatMessage,
    ErrorMessage,
    ReasoningMessage,
    ToolGroupMessage,
    TurnStartMessage,
    UserTextMessage,
)
from app.protocol.tool_requests import DecisionItem, ToolResultItem
from app.streaming.frames import SSE_LINE_END, Frame

Chunk = dict[str, Any]
DONE = ServerSentEvent(data="[DONE]", sep=SSE_LINE_END).encode()
HEARTBEAT = ServerSentEvent(comment="ping", sep=SSE_LINE_END).encode()
_FINISH = {"completed": "stop", "failed": "error", "interrupted": "interrupted"}


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass(slots=True)
class UiMessageStream:
    """One turn's chunks, fed the session's frames in order.

    `turn_id` is the turn to follow, when known; else `message_id`, the user message posted: the turn is
    the one its `user_message` event names. `continued`: the turn's first frames are behind (a
    continuation after client tool results or approval responses), so its `start` goes out at once."""

    version: int
    session_id: str
    turn_id: str | None = None
    message_id: str | None = None
    continued: bool = False
    ended: bool = False
    _started: bool = False
    _step: bool = False
    _texts: set[str] = field(default_factory=set)
    _reasoning: set[str] = field(default_factory=set)
    _calls: set[str] = field(default_factory=set)
    # The calls that wait for the kit (browser-side tools; from major 6, approvals) and whether the turn
    # said it waits (agent_status awaiting_input): see `settle`.
    _waits: set[str] = field(default_factory=set)
    _awaiting: bool = False

    def begin(self) -> list[Chunk]:
        """The chunks before any frame: the message's start, when its turn is already known."""
        return self._start() if self.continued else []

    def feed(self, frame: Frame) -> list[Chunk]:
        if self.ended:
            return []
        event: dict[str, Any] = json.loads(frame.data)
        kind = frame.type
        if kind == "resync":
            self.ended = True
            return [{"type": "error", "errorText": "The turn's events are no longer kept; reload the chat."}]
        if not self._started:
            if kind == "turn_start" and self.turn_id is not None and event["turn_id"] == self.turn_id:
                return self._start()
            if kind == "user_message" and event.get("turn_id") and event["id"] == self.message_id:
                self.turn_id = event["turn_id"]
                return self._start()
            return []
        out = self._chunks(kind, event)
        return [chunk for chunk in out if knows_chunk(self.version, chunk["type"])]

    def settle(self) -> list[Chunk]:
        """After each batch of frames: when the turn waits for the kit (a browser-side tool call, or from
        major 6 an approval), this request's answer ends with `finish` `tool-calls`; the kit answers with its
        next request, which continues the same turn and the same assistant message. Per batch rather than
        per frame: a replay comes as one batch, so a wait its later frames show answered ends nothing."""
        if self.ended or not self._started or not (self._awaiting and self._waits):
            return []
        self.ended = True
        return [*self._close_step(), self._finish("tool-calls")]

    def _start(self) -> list[Chunk]:
        self._started = True
        return [
            {"type": "start", "messageId": self.turn_id},
            _data("session", {"sessionId": self.session_id, "turnId": self.turn_id}),
        ]

    def _chunks(self, kind: str, event: dict[str, Any]) -> list[Chunk]:  # noqa: C901 (one branch per event)
        out: list[Chunk] = []
        if kind == "agent_status":
            if event["status"] == "thinking":
                out += self._close_step()
                out.append({"type": "start-step"})
                self._step = True
            out.append(_data("status", {"status": event["status"], "toolName": event.get("tool_name")}))
            self._awaiting = event["status"] == "awaiting_input"
        elif kind == "reasoning_delta":
            out += self._open_step()
            if event["id"] not in self._reasoning:
                self._reasoning.add(event["id"])
                out.append({"type": "reasoning-start", "id": event["id"]})
            out.append({"type": "reasoning-delta", "id": event["id"], "delta": event["text"]})
        elif kind == "text_delta":
            out += self._open_step()
            out += self._end_reasoning()
            if event["id"] not in self._texts:
                self._texts.add(event["id"])
                out.append({"type": "text-start", "id": event["id"]})
            out.append({"type": "text-delta", "id": event["id"], "delta": event["text"]})
        elif kind == "response_done":
            out += self._end_parts()
        elif kind == "token_usage":
            out.append(_data("usage", {k: v for k, v in event.items() if k not in ("type", "seq")}))
        elif kind == "tool_exec_start":
            call = event["tool_call"]
            out += self._call(call["id"], call["name"], call["arguments"])
        elif kind == "client_tool_requested":
            out += self._call(event["tool_call_id"], event["name"], event["arguments"])
            self._waits.add(event["tool_call_id"])
        elif kind == "approval_requested":
            out += self._call(event["tool_call_id"], event["name"], event["arguments"])
            out.append(_data("approval", {k: v for k, v in event.items() if k not in ("type", "seq")}))
            if self.version >= 6:
                # The kit's own approval (addToolApprovalResponse); the approval's id is the call's.
                call_id = event["tool_call_id"]
                out.append({"type": "tool-approval-request", "approvalId": call_id, "toolCallId": call_id})
                self._waits.add(call_id)
        elif kind in ("client_tool_resolved", "approval_resolved"):
            self._waits.discard(event["tool_call_id"])
        elif kind == "tool_exec_end":
            result = event["tool_result"]
            call_id = result["tool_call_id"]
            if result["is_error"]:
                out.append(
                    {"type": "tool-output-error", "toolCallId": call_id, "errorText": result["content"]}
                )
            else:
                out.append(
                    {"type": "tool-output-available", "toolCallId": call_id, "output": result["content"]}
                )
        elif kind in ("queue_updated", "user_message"):
            if kind == "queue_updated" or event.get("queued"):
                out.append(_data("queue", {k: v for k, v in event.items() if k not in ("type", "seq")}))
        elif kind == "error":
            out += self._end_parts()
            out.append({"type": "error", "errorText": event["message"]})
        elif kind == "turn_done" and event["turn_id"] == self.turn_id:
            out += self._close_step()
            if event["status"] == "cancelled":
                out.append(
                    {"type": "abort", "reason": "cancelled"} if self.version >= 6 else {"type": "abort"}
                )
            else:
                out.append(self._finish(_FINISH.get(event["status"], "other")))
            self.ended = True
        return out

    def _finish(self, reason: str) -> Chunk:
        return {
            "type": "finish",
            "finishReason": reason if reason in FINISH_REASONS[self.version] else "other",
        }

    def _call(self, call_id: str, name: str, arguments: Any) -> list[Chunk]:
        if call_id in self._calls:
            return []
        self._calls.add(call_id)
        return [
            *self._open_step(),
            *self._end_parts(),
            {"type": "tool-input-start", "toolCallId": call_id, "toolName": name},
            {"type": "tool-input-delta", "toolCallId": call_id, "inputTextDelta": _json(arguments)},
            {"type": "tool-input-available", "toolCallId": call_id, "toolName": name, "input": arguments},
        ]

    def _open_step(self) -> list[Chunk]:
        if self._step:
            return []
        self._step = True
        return [{"type": "start-step"}]

    def _close_step(self) -> list[Chunk]:
        out = self._end_parts()
        if self._step:
            self._step = False
            out.append({"type": "finish-step"})
        return out

    def _end_reasoning(self) -> list[Chunk]:
        out: list[Chunk] = [{"type": "reasoning-end", "id": part} for part in sorted(self._reasoning)]
        self._reasoning.clear()
        return out

    def _end_parts(self) -> list[Chunk]:
        out = self._end_reasoning()
        out += [{"type": "text-end", "id": part} for part in sorted(self._texts)]
        self._texts.clear()
        return out


def _data(name: str, value: Any) -> Chunk:
    return {"type": f"data-parley-{name}", "data": value, "transient": True}


async def sse_chunks(feed: TurnFeed, stream: UiMessageStream) -> AsyncIterator[bytes]:
    """The turn's chunks as SSE `data:` frames, `[DONE]` last; the feed is closed however it ends."""
    try:
        first = stream.begin()
        if first:
            yield _encode(first)
        async for batch in feed.batches():
            if not batch:
                yield HEARTBEAT
                continue
            chunks = [chunk for frame in batch for chunk in stream.feed(frame)]
            chunks += stream.settle()
            if chunks:
                yield _encode(chunks)
            if stream.ended:
                break
        if stream.ended:
            yield DONE
    finally:
        feed.close()


def _encode(chunks: list[Chunk]) -> bytes:
    return b"".join(ServerSentEvent(data=_json(chunk), sep=SSE_LINE_END).encode() for chunk in chunks)


# --- history -------------------------------------------------------------------------------------------


def ui_messages(rows: list[ChatMessage]) -> list[dict[str, Any]]:
    """Parley's history as `UIMessage`s: each user text a user message (its id the client's own, when it
    sent one), each turn's answer one assistant message whose id is the turn's, a step per model call."""
    messages: list[dict[str, Any]] = []
    answer: dict[str, Any] | None = None
    turn_id: str | None = None
    after_tools = True
    for row in rows:
        if isinstance(row, TurnStartMessage):
            turn_id, answer, after_tools = row.turn_id, None, True
        elif isinstance(row, UserTextMessage):
            messages.append(
                {
                    "id": row.client_message_id or row.id,
                    "role": "user",
                    "parts": [
                        *(_file_part(a) for a in row.attachments),
                        {"type": "text", "text": row.content, "state": "done"},
                    ],
                }
            )
            answer, after_tools = None, True
        elif isinstance(row, AssistantTextMessage | ReasoningMessage | ToolGroupMessage | ErrorMessage):
            if answer is None:
                answer = {"id": turn_id or row.id, "role": "assistant", "parts": []}
                messages.append(answer)
            parts: list[dict[str, Any]] = answer["parts"]
            is_tool = isinstance(row, ToolGroupMessage)
            if after_tools and not is_tool:
                parts.append({"type": "step-start"})
            if isinstance(row, ToolGroupMessage):
                if not parts:
                    parts.append({"type": "step-start"})
                parts.append(_tool_part(row))
            elif isinstance(row, AssistantTextMessage):
                parts.append({"type": "text", "text": row.content, "state": "done"})
            elif isinstance(row, ReasoningMessage):
                parts.append({"type": "reasoning", "text": row.content, "state": "done"})
            else:
                parts.append(
                    {"type": "data-parley-error", "data": {"code": row.code, "message": row.content}}
                )
            after_tools = is_tool
    return messages


def _tool_part(row: ToolGroupMessage) -> dict[str, Any]:
    part: dict[str, Any] = {
        "type": f"tool-{row.tool_name}",
        "toolCallId": row.tool_call_id,
        "input": row.arguments,
    }
    if row.result is None:
        part["state"] = "input-available"
    elif row.is_error:
        part.update(state="output-error", errorText=row.result)
    else:
        part.update(state="output-available", output=row.result)
    return part


# --- a request ------------------------------------------------------------------------------------------


async def answer(
    kits: KitChats, principal: str, body: ChatRequest, version: int
) -> tuple[TurnFeed, UiMessageStream]:
    """Takes the request's new input into the chat's session (bound on first use) and opens the stream of
    the turn that takes it: subscribed before the input is posted, so none of the turn's frames is missed."""
    last = body.messages[-1]
    if isinstance(last, UserUIMessage):
        kits.check_text(last.text())
    # useChat sends `messageId` with every resubmission (the last message's id: after tool outputs, the
    # assistant message's); only the last message being the user message it names, already sent, is an
    # edit. A regenerate or an edit is about a chat that has turns: it never binds a new one.
    edit = body.trigger == "submit-message" and isinstance(last, UserUIMessage) and body.messageId == last.id
    regenerate = body.trigger == "regenerate-message"
    session_id = await kits.session_for(principal, "ai-sdk", body.id, create=not regenerate)
    if session_id is None:
        raise NotFound(f"No chat {body.id!r}.", details={"chat_id": body.id})
    edited = await kits.find_turn(principal, session_id, body.messageId) if edit else None
    feed = await kits.open_feed(principal, session_id, None)
    try:
        if regenerate:
            turn_id = await kits.turn_of(principal, session_id, body.messageId)
            new_turn = await kits.regenerate(principal, session_id, turn_id)
            return feed, UiMessageStream(version, session_id, turn_id=new_turn)
        if edited is not None and isinstance(last, UserUIMessage):
            new_turn = await kits.edit(
                principal,
                session_id,
                edited,
                last.text(),
                client_message_id=last.id,
                attachments=list(last.attachments()),
            )
            return feed, UiMessageStream(version, session_id, turn_id=new_turn)
        if isinstance(last, UserUIMessage):
            message_id = await kits.post_text(
                principal,
                session_id,
                last.text(),
                client_message_id=last.id,
                client_tools=body.client_tools,
                attachments=list(last.attachments()),
            )
            return feed, UiMessageStream(version, session_id, message_id=message_id)
        turn_id = await kits.post_answers(
            principal, session_id, tool_outputs(last.parts), approval_responses(last.parts)
        )
        return feed, UiMessageStream(version, session_id, turn_id=turn_id, continued=True)
    except BaseException:
        feed.close()
        raise


async def resume(
    kits: KitChats, principal: str, chat_id: str, version: int
) -> tuple[TurnFeed, UiMessageStream] | None:
    """The chat's running turn, replayed from its start then live; None when no turn runs."""
    session_id = await kits.session_for(principal, "ai-sdk", chat_id, create=False)
    if session_id is None:
        return None
    running = await kits.running_turn(principal, session_id)
    if running is None:
        return None
    turn_id, before_start = running
    feed = await kits.open_feed(principal, session_id, before_start)
    return feed, UiMessageStream(version, session_id, turn_id=turn_id)


async def chat_messages(kits: KitChats, principal: str, chat_id: str) -> list[dict[str, Any]]:
    session_id = await kits.session_for(principal, "ai-sdk", chat_id, create=False)
    if session_id is None:
        return []
    return ui_messages(await kits.history(principal, session_id))


def tool_outputs(parts: list[UIPart]) -> list[ToolResultItem]:
    """The results of browser-side tool calls the kit put in an assistant message's tool parts."""
    results: list[ToolResultItem] = []
    for part in parts:
        extra = part.model_extra or {}
        call_id = extra.get("toolCallId")
        is_tool = part.type.startswith("tool-") or part.type == "dynamic-tool"
        if not is_tool or not isinstance(call_id, str) or not 0 < len(call_id) <= 200:
            continue
        if extra.get("state") == "output-available":
            output = extra.get("output")
            results.append(ToolResultItem(tool_call_id=call_id, output="" if output is None else output))
        elif extra.get("state") == "output-error":
            results.append(
                ToolResultItem(tool_call_id=call_id, error=str(extra.get("errorText") or "error")[:100_000])
            )
    return results


def approval_responses(parts: list[UIPart]) -> list[DecisionItem]:
    """The kit's own approval responses (major 6 on: `addToolApprovalResponse`) in an assistant message's
    tool parts, state `approval-responded` with `approval: {id, approved, reason?}`, as Parley's decisions."""
    decisions: list[DecisionItem] = []
    for part in parts:
        extra = part.model_extra or {}
        call_id = extra.get("toolCallId")
        approval = extra.get("approval")
        is_tool = part.type.startswith("tool-") or part.type == "dynamic-tool"
        if not is_tool or not isinstance(call_id, str) or not 0 < len(call_id) <= 200:
            continue
        if extra.get("state") != "approval-responded" or not isinstance(approval, dict):
            continue
        approved = approval.get("approved")
        reason = approval.get("reason")
        if isinstance(approved, bool):
            decisions.append(
                DecisionItem(
                    tool_call_id=call_id,
                    decision="approve" if approved else "reject",
                    reason=reason[:10_000] if isinstance(reason, str) else None,
                )
            )
    return decisions


def _file_part(attachment: Attachment) -> dict[str, Any]:
    """A stored attachment as the kit's file part: its bytes at Parley's content route (which takes the
    same credentials as every route), never inline."""
    return {
        "type": "file",
        "mediaType": attachment.media_type,
        "filename": attachment.name,
        "url": f"/v1/files/{attachment.file_id}/content",
    }
