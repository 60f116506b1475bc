"""Parley's event stream and history as AG-UI events: a run is the turn its input starts (or continues),
each model call a step, and Parley's extras `CUSTOM` events named `parley.*`. Events are the official
`ag-ui-protocol` package's models, serialized by them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ag_ui.core import (
    AssistantMessage,
    BaseEvent,
    CustomEvent,
    FunctionCall,
    Interrupt,
    Message,
    MessagesSnapshotEvent,
    ReasoningEndEvent,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    StateSnapshotEvent,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCall,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    ToolMessage,
    UserMessage,
)
from sse_starlette import ServerSentEvent

from app.chat.kit_chats import KitChats, TurnFeed
from app.protocol.ag_ui import RunInput, client_tools, context_note
from app.protocol.schemas import (
    AssistantTextMessage,
    ChatMessage,
    ErrorMessage,
    ToolGroupMessage,
    TurnStartMessage,
    UserTextMessage,
)
from app.protocol.tool_requests import DecisionItem, ToolResultItem
from app.streaming.frames import SSE_LINE_END, Frame

HEARTBEAT = ServerSentEvent(comment="ping", sep=SSE_LINE_END).encode()
_DECISIONS = ("approve", "edit", "reject")


def _fields(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k not in ("type", "seq")}


@dataclass(slots=True)
class AgUiRun:
    """One run's events, fed the session's frames in order (the same following rules as the AI SDK's
    UiMessageStream: `turn_id` when known, else the turn that takes `message_id`)."""

    thread_id: str
    run_id: str
    session_id: str
    turn_id: str | None = None
    message_id: str | None = None
    # The frontend's shared state, echoed at the run's start: Parley keeps none, and a shared-state UI
    # (CopilotKit's useCoAgent) keeps its own as it was.
    state: Any = None
    # A client that declares no `protocolVersion` (before 1.0: @ag-ui/client 0.0.x, which CopilotKit 1.x
    # ships) validates RUN_FINISHED's outcome strictly: `success` without `pendingToolCallIds`, and no
    # `cancelled` (its run just finishes).
    legacy: bool = False
    continued: bool = False
    ended: bool = False
    _following: bool = False
    _step: str | None = None
    _steps: int = 0
    _text: str | None = None
    # The model response's text message: its tool calls hang on it (parentMessageId).
    _said: str | None = None
    _reasoning: str | None = None
    _calls: set[str] = field(default_factory=set)
    _client_waits: list[str] = field(default_factory=list)
    _approvals: list[Interrupt] = field(default_factory=list)

    def begin(self, snapshot: list[Message] | None) -> list[BaseEvent]:
        out: list[BaseEvent] = [RunStartedEvent(thread_id=self.thread_id, run_id=self.run_id)]
        if self.state not in (None, {}):
            out.append(StateSnapshotEvent(snapshot=self.state))
        if snapshot is not None:
            out.append(MessagesSnapshotEvent(messages=snapshot))
        if self.continued:
            out += self._follow()
        return out

    def idle(self) -> list[BaseEvent]:
        """The end of a run that had nothing to follow (an attach with no running turn)."""
        self.ended = True
        return [RunFinishedEvent(thread_id=self.thread_id, run_id=self.run_id)]

    def feed(self, frame: Frame) -> list[BaseEvent]:
        if self.ended:
            return []
        event: dict[str, Any] = json.loads(frame.data)
        kind = frame.type
        if kind == "resync":
            self.ended = True
            return [
                RunErrorEvent(
                    message="The turn's events are no longer kept; reload the thread.", code="resync"
                )
            ]
        if not self._following:
            if kind == "turn_start" and self.turn_id is not None and event["turn_id"] == self.turn_id:
                return self._follow()
            if kind == "user_message" and event.get("turn_id") and event["id"] == self.message_id:
                self.turn_id = event["turn_id"]
                return self._follow()
            return []
        return self._events(kind, event)

    def _follow(self) -> list[BaseEvent]:
        self._following = True
        return [_custom("session", {"sessionId": self.session_id, "turnId": self.turn_id})]

    def _events(self, kind: str, event: dict[str, Any]) -> list[BaseEvent]:  # noqa: C901 (one branch per event)
        out: list[BaseEvent] = []
        if kind == "agent_status":
            status = event["status"]
            if status == "thinking":
                out += self._close_step()
                self._said = None
                self._steps += 1
                self._step = f"model call {self._steps}"
                out.append(StepStartedEvent(step_name=self._step))
            out.append(_custom("agent_status", _fields(event)))
            if status == "awaiting_input" and (self._client_waits or self._approvals):
                out += self._close_step()
                out.append(self._waiting_end())
                self.ended = True
        elif kind == "reasoning_delta":
            out += self._open_step()
            if self._reasoning != event["id"]:
                out += self._end_parts()
                self._reasoning = event["id"]
                out += [
                    ReasoningStartEvent(message_id=event["id"]),
                    ReasoningMessageStartEvent(message_id=event["id"], role="reasoning"),
                ]
            if event["text"]:
                out.append(ReasoningMessageContentEvent(message_id=event["id"], delta=event["text"]))
        elif kind == "text_delta":
            out += self._open_step()
            if self._text != event["id"]:
                out += self._end_parts()
                self._text = self._said = event["id"]
                out.append(TextMessageStartEvent(message_id=event["id"], role="assistant"))
            if event["text"]:
                out.append(TextMessageContentEvent(message_id=event["id"], delta=event["text"]))
        elif kind == "response_done":
            out += self._end_parts()
        elif kind in ("token_usage", "queue_updated"):
            out.append(_custom("usage" if kind == "token_usage" else "queue", _fields(event)))
        elif kind == "tool_exec_start":
            call = event["tool_call"]
            out += self._call(call["id"], call["name"], call["arguments"])
        elif kind == "client_tool_requested":
            out += self._call(event["tool_call_id"], event["name"], event["arguments"])
            self._client_waits.append(event["tool_call_id"])
        elif kind == "approval_requested":
            out += self._call(event["tool_call_id"], event["name"], event["arguments"])
            self._approvals.append(
                Interrupt(
                    id=event["tool_call_id"],
                    reason="tool_approval",
                    tool_call_id=event["tool_call_id"],
                    message=f"Approve the call of {event['name']}?",
                    expires_at=event["expires_at"],
                )
            )
        elif kind == "tool_exec_end" and event["source"] != "client":  # the frontend has its own results
            result = event["tool_result"]
            out.append(
                ToolCallResultEvent(
                    message_id=f"{event['id']}-result",
                    tool_call_id=result["tool_call_id"],
                    content=result["content"],
                    role="tool",
                )
            )
        elif kind == "error":
            out += self._end_parts()
            out.append(RunErrorEvent(message=event["message"], code=event["code"]))
            self.ended = True
        elif kind == "turn_done" and event["turn_id"] == self.turn_id:
            out += self._close_step()
            outcome: Any = RunFinishedSuccessOutcome()
            if event["status"] == "cancelled":
                outcome = None if self.legacy else RunFinishedCancelledOutcome()
            out.append(RunFinishedEvent(thread_id=self.thread_id, run_id=self.run_id, outcome=outcome))
            self.ended = True
        return out

    def _waiting_end(self) -> RunFinishedEvent:
        """A run that stops where the turn waits: for approvals an interrupt outcome (the next run's
        `resume` answers it); for frontend tools a success naming the calls the frontend answers next."""
        if self._approvals:
            outcome: Any = RunFinishedInterruptOutcome(interrupts=self._approvals)
        elif self.legacy:  # the frontend knows its calls from the TOOL_CALL_* events
            outcome = RunFinishedSuccessOutcome()
        else:
            outcome = RunFinishedSuccessOutcome(pending_tool_call_ids=self._client_waits)
        return RunFinishedEvent(thread_id=self.thread_id, run_id=self.run_id, outcome=outcome)

    def _call(self, call_id: str, name: str, arguments: Any) -> list[BaseEvent]:
        if call_id in self._calls:
            return []
        self._calls.add(call_id)
        return [
            *self._open_step(),
            *self._end_parts(),
            ToolCallStartEvent(tool_call_id=call_id, tool_call_name=name, parent_message_id=self._said),
            ToolCallArgsEvent(tool_call_id=call_id, delta=json.dumps(arguments, ensure_ascii=False)),
            ToolCallEndEvent(tool_call_id=call_id),
        ]

    def _open_step(self) -> list[BaseEvent]:
        if self._step is not None:
            return []
        self._steps += 1
        self._step = f"model call {self._steps}"
        return [StepStartedEvent(step_name=self._step)]

    def _close_step(self) -> list[BaseEvent]:
        out = self._end_parts()
        if self._step is not None:
            out.append(StepFinishedEvent(step_name=self._step))
            self._step = None
        return out

    def _end_parts(self) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        if self._reasoning is not None:
            out += [
                ReasoningMessageEndEvent(message_id=self._reasoning),
                ReasoningEndEvent(message_id=self._reasoning),
            ]
            self._reasoning = None
        if self._text is not None:
            out.append(TextMessageEndEvent(message_id=self._text))
            self._text = None
        return out


def _custom(name: str, value: Any) -> CustomEvent:
    return CustomEvent(name=f"parley.{name}", value=value)


def _encode(events: list[BaseEvent]) -> bytes:
    return b"".join(
        ServerSentEvent(
            data=event.model_dump_json(by_alias=True, exclude_none=True), sep=SSE_LINE_END
        ).encode()
        for event in events
    )


async def sse_events(feed: TurnFeed | None, run: AgUiRun, first: list[BaseEvent]) -> AsyncIterator[bytes]:
    """The run's events as SSE frames; a run with no feed ends after `first`. The feed is closed however
    the stream ends."""
    try:
        if feed is None:
            yield _encode([*first, *run.idle()])
            return
        yield _encode(first)
        async for batch in feed.batches():
            if not batch:
                yield HEARTBEAT
                continue
            events = [event for frame in batch for event in run.feed(frame)]
            if events:
                yield _encode(events)
            if run.ended:
                break
    finally:
        if feed is not None:
            feed.close()


# --- a request ------------------------------------------------------------------------------------------


async def start(
    kits: KitChats, principal: str, body: RunInput
) -> tuple[TurnFeed | None, AgUiRun, list[BaseEvent]]:
    """Takes the run's new input (a user message, frontend tool results, answers to interrupts) into the
    thread's session and opens the stream of the turn that takes it, subscribed before the input is
    posted. A run with no new input attaches: Parley's history as a snapshot, then the running turn, if
    any, replayed from its start. The run's context goes with its user message as a note for the model
    (nothing else reads it); `forwardedProps.parley` may set the session's model first."""
    text, results = _new_input(body.messages)
    note = context_note(body.context) if text is not None else None
    if text is not None:
        kits.check_text(text)
    if note is not None:
        kits.check_note(note)
    props = body.parley()
    session_id = await kits.session_for(principal, "ag-ui", body.thread_id, create=True, model=props.model)
    assert session_id is not None  # created when missing
    if props.model is not None:
        await kits.use_model(principal, session_id, props.model)
    run = AgUiRun(
        body.thread_id, body.run_id, session_id, state=body.state, legacy=body.protocol_version is None
    )
    decisions = _decisions(body)
    waiting = await kits.waiting_calls(principal, session_id) if results else set()
    results = [r for r in results if r.tool_call_id in waiting]
    if text is None and not results and not decisions:
        running = await kits.running_turn(principal, session_id)
        history = await kits.history(principal, session_id)
        if running is None:
            return None, run, run.begin(ag_ui_messages(history))
        run.turn_id, before_start = running
        feed = await kits.open_feed(principal, session_id, before_start)
        return feed, run, run.begin(ag_ui_messages(history, until_turn=run.turn_id))
    feed = await kits.open_feed(principal, session_id, None)
    try:
        if decisions:
            run.turn_id = await kits.post_decisions(principal, session_id, decisions)
            run.continued = True
        if results:
            run.turn_id = await kits.post_results(principal, session_id, results)
            run.continued = True
        if text is not None and not run.continued:
            run.message_id = await kits.post_text(
                principal,
                session_id,
                text,
                client_message_id=_last_user_id(body.messages),
                client_tools=client_tools(body.tools),
                delivery=props.delivery or "steer",
                note=note,
            )
    except BaseException:
        feed.close()
        raise
    return feed, run, run.begin(None)


def _last_user_id(messages: Sequence[Message]) -> str | None:
    last = messages[-1] if messages else None
    return last.id[:100] if isinstance(last, UserMessage) and last.id else None


def _new_input(messages: Sequence[Message]) -> tuple[str | None, list[ToolResultItem]]:
    """The text of a trailing user message, or the results of the trailing tool messages."""
    if not messages:
        return None, []
    last = messages[-1]
    if isinstance(last, UserMessage):
        content = last.content
        if isinstance(content, str):
            text = content
        else:
            text = "\n\n".join(
                getattr(part, "text", "") or "" for part in content if getattr(part, "type", None) == "text"
            )
        return (text if text.strip() else None), []
    results: list[ToolResultItem] = []
    for message in reversed(messages):
        if not isinstance(message, ToolMessage):
            break
        if not 0 < len(message.tool_call_id) <= 200:
            continue
        content = (
            message.content
            if isinstance(message.content, str)
            else json.dumps([part.model_dump(by_alias=True, exclude_none=True) for part in message.content])
        )
        if message.error:
            results.append(ToolResultItem(tool_call_id=message.tool_call_id, error=message.error[:100_000]))
        else:
            results.append(ToolResultItem(tool_call_id=message.tool_call_id, output=content))
    results.reverse()
    return None, results


def _decisions(body: RunInput) -> list[DecisionItem]:
    """`resume` entries answering approval interrupts (their id is the call's): `resolved` with a payload
    `{decision, arguments?, reason?}` (a payload without a decision approves), `cancelled` rejects."""
    items: list[DecisionItem] = []
    for entry in body.resume or []:
        if not 0 < len(entry.interrupt_id) <= 200:
            continue
        payload = entry.payload if isinstance(entry.payload, dict) else {}
        decision = payload.get("decision", "approve") if entry.status == "resolved" else "reject"
        if decision not in _DECISIONS:
            decision = "approve" if payload.get("approved", True) is True else "reject"
        arguments = payload.get("arguments") if decision == "edit" else None
        if decision == "edit" and not isinstance(arguments, dict):
            decision = "approve"
        reason = payload.get("reason")
        items.append(
            DecisionItem(
                tool_call_id=entry.interrupt_id,
                decision=decision,
                arguments=arguments if decision == "edit" else None,
                reason=reason[:10_000] if isinstance(reason, str) else None,
            )
        )
    return items


# --- history -------------------------------------------------------------------------------------------


def ag_ui_messages(rows: list[ChatMessage], *, until_turn: str | None = None) -> list[Message]:
    """Parley's history as AG-UI messages: user texts, an assistant message per model response (its text
    and its tool calls), a tool message per result. `until_turn`: stop at that turn's start (its events
    follow as a replay)."""
    messages: list[Message] = []
    assistant: AssistantMessage | None = None
    results: list[ToolMessage] = []

    def flush() -> None:
        nonlocal assistant
        if assistant is not None:
            messages.append(assistant)
            messages.extend(results)
        assistant = None
        results.clear()

    for row in rows:
        if isinstance(row, TurnStartMessage):
            flush()
            if row.turn_id == until_turn:
                break
        elif isinstance(row, UserTextMessage):
            flush()
            messages.append(UserMessage(id=row.client_message_id or row.id, content=row.content))
        elif isinstance(row, AssistantTextMessage):
            if assistant is not None and (assistant.tool_calls or assistant.content):
                flush()
            assistant = AssistantMessage(id=row.id, content=row.content)
        elif isinstance(row, ToolGroupMessage):
            assistant = _with_call(assistant or AssistantMessage(id=row.id), row)
            if row.result is not None:
                results.append(_result(row))
        elif isinstance(row, ErrorMessage):
            flush()
    flush()
    return messages


def _with_call(assistant: AssistantMessage, row: ToolGroupMessage) -> AssistantMessage:
    arguments = json.dumps(row.arguments, ensure_ascii=False)
    call = ToolCall(id=row.tool_call_id, function=FunctionCall(name=row.tool_name, arguments=arguments))
    assistant.tool_calls = [*(assistant.tool_calls or []), call]
    return assistant


def _result(row: ToolGroupMessage) -> ToolMessage:
    return ToolMessage(
        id=f"{row.id}-result",
        tool_call_id=row.tool_call_id,
        content=row.result or "",
        error=row.result if row.is_error else None,
    )
