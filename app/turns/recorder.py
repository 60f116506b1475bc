"""Records one turn: the only writer of a turn's chat_messages rows (seed 000 §2.4.1) and its events.

It opens the turn (turn_start and the user messages it takes), turns agent events into rows and enriched
wire events, keeps the live status, and closes the turn every way a turn can end: completed, failed,
stopped, or left open by a crash (recovery hands it the turn to close). Every row change is written in
one transaction with the events that announce it, so a client never misses what the history holds.

Text is accumulated in memory and persisted by the write-behind (at most every second), then written
for good at response_done, at a stop and at the turn's end. Tool rows are written when the tool starts
and when it ends, so a crash never loses a result that was announced.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlmodel.ext.asyncio.session import AsyncSession

from app.llm.types import ProviderError
from app.protocol.clock import now_iso
from app.protocol.events import (
    AgentCancelled,
    AgentState,
    AgentStatus,
    ErrorEvent,
    QueuedItem,
    QueueUpdated,
    ResponseDone,
    ResponseInfo,
    TextDelta,
    TokenUsage,
    ToolCall,
    ToolExecEnd,
    ToolExecStart,
    ToolResult,
    TurnDone,
    TurnStart,
    TurnStatus,
    Usage,
    UserMessage,
    clean_text,
)
from app.protocol.ids import new_message_id
from app.protocol.schemas import QueuedMessage
from app.storage import repository
from app.storage.tables import ChatMessageRow
from app.streaming.frames import Publisher
from app.streaming.writer import TextBuffer, WriteBehind
from app.turns.agent import (
    AgentError,
    AgentEvent,
    AgentRun,
    BreakpointReached,
    CallRequest,
    ResponseFinished,
    ResponseStarted,
    TextChunk,
    ToolFinished,
    ToolStarted,
)
from app.turns.live import LiveStatus, LiveStatusBoard

log = logging.getLogger(__name__)

TOOL_INTERRUPTED_BY_USER = "[Tool execution interrupted by user]"
TOOL_INTERRUPTED_BY_ERROR = "[Tool execution interrupted by an error]"
TOOL_INTERRUPTED_BY_RESTART = "[Tool execution interrupted by server restart]"


@dataclass
class _OpenTool:
    row_id: str
    name: str


@dataclass
class TurnRecorder:
    writer: WriteBehind
    events: Publisher
    live: LiveStatusBoard
    session_id: str
    turn_id: str
    model: str
    context_window: int | None = None
    taken_ids: frozenset[str] = frozenset()
    # How a stop is recorded: by a user (cancelled), or by the server shutting down (interrupted).
    stop_status: TurnStatus = "cancelled"
    stop_tool_result: str = TOOL_INTERRUPTED_BY_USER
    started: float = field(default_factory=time.monotonic)
    closed: bool = False
    _response_id: str | None = None
    _text: TextBuffer | None = None
    _text_timestamp: str = ""
    _open_tools: dict[str, _OpenTool] = field(default_factory=dict)
    # The calls of the current tool round, so a stop can give the ones not started yet their result.
    _round_calls: list[CallRequest] = field(default_factory=list)
    _started_calls: set[str] = field(default_factory=set)
    interrupted_message_ids: list[str] = field(default_factory=list)
    interrupted_tool_call_ids: list[str] = field(default_factory=list)
    # Stop control. A stop cancels the turn's task only between the recorder's writes, never inside
    # one: a write cut in half would leave a row without its result, or state that disagrees with the
    # database (a call noted as not started whose row exists, a text rolled back but detached).
    task: asyncio.Task[None] | None = None
    _writing: int = 0
    _stop_requested: bool = False
    _finishing: bool = False

    def request_stop(self, *, by_server: bool = False) -> bool:
        """Stops the turn as soon as no write is in progress. False when it is already ending by itself.
        A stop `by_server` (shutdown) records the turn as interrupted rather than cancelled."""
        if by_server:
            self.stop_status = "interrupted"
            self.stop_tool_result = TOOL_INTERRUPTED_BY_RESTART
        if self._finishing:
            return False
        if not self._stop_requested:
            self._stop_requested = True
            if not self._writing and self.task is not None:
                self.task.cancel()
        return True

    @contextmanager
    def _atomic(self) -> Iterator[None]:
        self._writing += 1
        try:
            yield
        finally:
            self._writing -= 1
        if self._stop_requested and not self._writing and not self._finishing:
            # The stop that arrived during the write takes effect now, where the state is whole.
            raise asyncio.CancelledError

    # --- the turn ------------------------------------------------------------------------------------

    async def open(
        self, messages: Sequence[QueuedMessage], *, waiting: list[QueuedItem] | None = None
    ) -> None:
        """Starts the turn: its turn_start and the user messages it takes, with their events, in one
        transaction. `waiting` is the waiting line once the messages left it, when they come from it."""
        at = now_iso()
        start = self._row("turn_start", at)
        users = [
            self._row(
                "text",
                m.timestamp,
                id=m.id,
                role="user",
                content=m.content,
                sender=m.sender,
                client_message_id=m.client_message_id,
            )
            for m in messages
        ]
        async with self._transaction() as db:
            if waiting is not None:
                await repository.dequeue(db, [m.id for m in messages])
            await repository.insert_messages(db, [start, *users])
            if waiting is not None:
                self.events.emit(QueueUpdated, queue=waiting)
            self.events.emit(TurnStart, id=start.id, turn_id=self.turn_id, timestamp=at)
            for m in messages:
                self.events.emit(
                    UserMessage,
                    id=m.id,
                    text=m.content,
                    timestamp=m.timestamp,
                    turn_id=self.turn_id,
                    model=self.model,
                    sender=m.sender,
                    client_message_id=m.client_message_id,
                )
            self.set_status("thinking")

    async def record(self, agent: AgentRun) -> None:
        """Runs the agent to the end of the turn; every way out closes the turn exactly once."""
        self.context_window = agent.model.context_window
        events = agent.run()
        try:
            async for event in events:
                await self._on(event)
        except asyncio.CancelledError:
            self._finishing = True
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            # Close the agent first: that closes the provider stream and cancels running tools.
            await events.aclose()
            await self.finish_cancelled()
            return
        except (ProviderError, AgentError) as exc:
            self._finishing = True
            await events.aclose()
            await self.finish_failed(exc.code, exc.message)
            return
        except Exception:
            log.exception("turn %s failed", self.turn_id)
            self._finishing = True
            await events.aclose()
            await self.finish_failed("internal_error", "The turn failed because of an internal error.")
            return
        await self.close("completed")

    async def _on(self, event: AgentEvent) -> None:
        if type(event) is TextChunk:
            # The hot path. No write: the first delta's row is inserted by the next commit.
            text = clean_text(event.text)
            buffer = self._text
            if buffer is None:
                self._on_first_text(text)
            else:
                buffer.parts.append(text)
                self.events.text_delta(buffer.message_id, text)
            return
        with self._atomic():
            await self._dispatch(event)

    async def _dispatch(self, event: AgentEvent) -> None:
        if isinstance(event, ResponseStarted):
            self._response_id = new_message_id()
            self._text = None
        elif isinstance(event, ResponseFinished):
            self._round_calls, self._started_calls = list(event.calls), set()
            await self._on_response_done(event)
        elif isinstance(event, ToolStarted):
            await self._on_tool_start(event)
        elif isinstance(event, ToolFinished):
            await self._on_tool_end(event)
        elif isinstance(event, BreakpointReached):
            pass

    def _row(self, type_: str, timestamp: str, **fields: Any) -> ChatMessageRow:
        return ChatMessageRow(
            id=fields.pop("id", None) or new_message_id(),
            session_id=self.session_id,
            turn_id=self.turn_id,
            type=type_,
            timestamp=timestamp,
            **fields,
        )

    def _transaction(self) -> AbstractAsyncContextManager[AsyncSession]:
        """A write of the turn; events emitted inside it commit with it and are delivered right after."""
        return self.writer.transaction(self.session_id)

    def _tool_row(self, call: CallRequest, timestamp: str, **fields: Any) -> ChatMessageRow:
        return self._row(
            "tool_group",
            timestamp,
            role="assistant",
            model=self.model,
            response_id=self._response_id,
            tool_call_id=call.id,
            tool_name=call.name,
            arguments=call.arguments,
            **fields,
        )

    def _emit(self, cls: Any, **fields: Any) -> None:
        self.events.emit(cls, **fields)

    def set_status(self, status: AgentState, tool_name: str | None = None) -> None:
        self.live.set(self.session_id, LiveStatus(status, None if status == "idle" else self.turn_id))
        self._emit(AgentStatus, status=status, tool_name=tool_name, turn_id=self.turn_id)

    # --- model text ----------------------------------------------------------------------------------

    def _on_first_text(self, text: str) -> None:
        """Opens the message: its row is inserted by the next commit (the write-behind's batch, or this
        turn's next write), which also commits this first delta's event, so neither is seen without
        the other."""
        assert self._response_id is not None
        self._text_timestamp = now_iso()
        row = self._row(
            "text",
            self._text_timestamp,
            id=self._response_id,
            role="assistant",
            content=text,
            model=self.model,
            response_id=self._response_id,
        )
        buffer = self._text = TextBuffer(row)
        self._emit(
            TextDelta, id=buffer.message_id, text=text, timestamp=self._text_timestamp, model=self.model
        )
        self.writer.track(buffer)

    async def _on_response_done(self, event: ResponseFinished) -> None:
        buffer, self._text = self._text, None
        usage = event.usage
        at = now_iso()
        async with self._transaction() as db:
            if buffer is not None:
                self.writer.untrack(buffer)
                await repository.update_message(
                    db, buffer.message_id, {"content": buffer.text(), "duration_ms": event.duration_ms}
                )
            totals = None
            if usage is not None:
                totals = await repository.add_usage(
                    db,
                    self.session_id,
                    prompt=usage.prompt_tokens,
                    completion=usage.completion_tokens,
                    window=self.context_window,
                    at=at,
                )
            self._announce_response(buffer, event, totals)

    def _announce_response(
        self, buffer: TextBuffer | None, event: ResponseFinished, totals: tuple[int, int] | None
    ) -> None:
        usage = event.usage
        self._emit(
            ResponseDone,
            id=buffer.message_id if buffer is not None else None,
            duration_ms=event.duration_ms,
            response=ResponseInfo(
                model=self.model,
                finish_reason=event.finish_reason,
                usage=Usage(
                    prompt_tokens=usage.prompt_tokens,
                    completion_tokens=usage.completion_tokens,
                    total_tokens=usage.prompt_tokens + usage.completion_tokens,
                )
                if usage is not None
                else None,
            ),
        )
        if totals is not None:
            total, used = totals
            window = self.context_window
            self._emit(
                TokenUsage,
                context_used=used,
                context_window=window,
                context_percent=round(used * 100 / window, 1) if window else None,
                session_total_tokens=total,
                model=self.model,
            )

    # --- tools ---------------------------------------------------------------------------------------

    async def _on_tool_start(self, event: ToolStarted) -> None:
        call = event.call
        row = self._tool_row(call, now_iso())
        async with self._transaction() as db:
            await repository.insert_messages(db, [row])
            self._emit(
                ToolExecStart,
                id=row.id,
                tool_call=ToolCall(id=call.id, name=call.name, arguments=row.arguments),
                timestamp=row.timestamp,
                model=self.model,
            )
            self.set_status("tool_calling", call.name)
        self._open_tools[call.id] = _OpenTool(row.id, call.name)
        self._started_calls.add(call.id)

    async def _on_tool_end(self, event: ToolFinished) -> None:
        tool = self._open_tools.pop(event.call.id)
        outcome = event.outcome
        async with self._transaction() as db:
            await repository.update_message(
                db,
                tool.row_id,
                {"result": outcome.content, "is_error": outcome.is_error, "duration_ms": event.duration_ms},
            )
            self._emit(
                ToolExecEnd,
                id=tool.row_id,
                tool_result=ToolResult(
                    tool_call_id=event.call.id, content=outcome.content, is_error=outcome.is_error
                ),
                timestamp=now_iso(),
                duration_ms=event.duration_ms,
            )
            running = next(iter(self._open_tools.values()), None)
            if running is not None:
                self.set_status("tool_calling", running.name)
            else:
                self.set_status("thinking")

    # --- ends ----------------------------------------------------------------------------------------

    async def commit_partial(self, tool_result: str, announce: Callable[[], None] | None = None) -> None:
        """Seed 004's partial-state commit: streamed text is kept and marked, and every call of the
        interrupted round ends with exactly one result (finished calls keep theirs). `announce` emits
        the events that go out with this commit."""
        buffer, self._text = self._text, None
        open_tools, self._open_tools = self._open_tools, {}
        unstarted = [c for c in self._round_calls if c.id not in self._started_calls]
        self._round_calls = []
        at = now_iso()
        rows = [
            self._tool_row(call, at, result=tool_result, is_error=True, duration_ms=0) for call in unstarted
        ]
        self.interrupted_message_ids = [
            *([buffer.message_id] if buffer is not None else []),
            *(tool.row_id for tool in open_tools.values()),
            *(row.id for row in rows),
        ]
        self.interrupted_tool_call_ids = [*open_tools, *(call.id for call in unstarted)]
        async with self._transaction() as db:
            if buffer is not None:
                self.writer.untrack(buffer)
                await repository.update_message(
                    db, buffer.message_id, {"content": buffer.text(), "interrupted": True}
                )
            for tool in open_tools.values():
                await repository.update_message(
                    db, tool.row_id, {"result": tool_result, "is_error": True, "interrupted": True}
                )
            if rows:
                await repository.insert_messages(db, rows)
            if announce is not None:
                announce()

    async def finish_cancelled(self) -> None:
        self._finishing = True
        await self.commit_partial(self.stop_tool_result, self._announce_cancelled)
        await self.close(self.stop_status)

    def _announce_cancelled(self) -> None:
        self.set_status("idle")
        self._emit(
            AgentCancelled,
            turn_id=self.turn_id,
            interrupted_message_ids=self.interrupted_message_ids,
            interrupted_tool_call_ids=self.interrupted_tool_call_ids,
        )

    async def finish_failed(self, code: str, message: str) -> None:
        self._finishing = True
        await self.commit_partial(TOOL_INTERRUPTED_BY_ERROR)
        await self.fail(code, message)
        await self.close("failed")

    async def fail(self, code: str, message: str) -> None:
        row = self._row("error", now_iso(), role="assistant", content=message, code=code, model=self.model)
        async with self._transaction() as db:
            await repository.insert_messages(db, [row])
            self._emit(
                ErrorEvent, id=row.id, message=message, code=code, model=self.model, timestamp=row.timestamp
            )

    async def close(self, status: TurnStatus) -> None:
        if self.closed:
            return
        self._finishing = True
        self.closed = True
        duration = round(time.monotonic() - self.started, 3)
        row = self._row("turn_done", now_iso(), duration_seconds=duration, status=status)
        async with self._transaction() as db:
            await repository.insert_messages(db, [row])
            self._announce_end(row)

    def _announce_end(self, done: ChatMessageRow) -> None:
        if self.live.get(self.session_id).agent_status != "idle":
            self.set_status("idle")
        self._emit(
            TurnDone,
            id=done.id,
            turn_id=self.turn_id,
            timestamp=done.timestamp,
            duration_seconds=done.duration_seconds or 0.0,
            status=done.status or "completed",
        )

    # --- after a crash -------------------------------------------------------------------------------

    async def close_after_restart(
        self, started_at: str, rows: Sequence[ChatMessageRow], seen_text: Mapping[str, str]
    ) -> None:
        """Closes a turn a crash left open, as a stop by the server would have: its streamed text kept as
        `seen_text` gives it and marked, its calls without a result given TOOL_INTERRUPTED_BY_RESTART, and
        a turn_done interrupted. Its duration runs from its start to this close (downtime included: when
        the process died is not recorded)."""
        self._finishing = self.closed = True
        at = now_iso()
        done = self._row(
            "turn_done", at, duration_seconds=_seconds_between(started_at, at), status="interrupted"
        )
        async with self._transaction() as db:
            for row in rows:
                if row.type == "tool_group" and row.result is None:
                    values = {"result": TOOL_INTERRUPTED_BY_RESTART, "is_error": True, "interrupted": True}
                    await repository.update_message(db, row.id, values)
                    self.interrupted_message_ids.append(row.id)
                    self.interrupted_tool_call_ids.append(row.tool_call_id or "")
                elif row.type == "text" and row.role == "assistant" and row.duration_ms is None:
                    content = seen_text.get(row.id, row.content or "")
                    await repository.update_message(db, row.id, {"content": content, "interrupted": True})
                    self.interrupted_message_ids.append(row.id)
            await repository.insert_messages(db, [done])
            self._announce_cancelled()
            self._announce_end(done)

    async def announce_lost_end(self, done: ChatMessageRow) -> None:
        """Announces a turn_done row whose event was lost (a log written by a version that committed a
        turn's end before its event)."""
        self._finishing = self.closed = True
        async with self._transaction():
            self.set_status("idle")
            self._announce_end(done)


def _seconds_between(start: str, end: str) -> float:
    elapsed = (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    return round(max(elapsed, 0.0), 3)
