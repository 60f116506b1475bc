"""Records one running turn: agent events become chat_messages rows (docs/protocol.md) and enriched
wire events. With its base (turns.ends.TurnLog) it is the only writer of a turn's rows and events.

It opens the turn (turn_start and the user messages it takes), keeps the live status, and turns the
agent's events into rows and events; every row change is written in one transaction with the events
that announce it, so a client never misses what the history holds. A stop takes effect only between
its writes (request_stop).

Text is accumulated in memory and persisted by the write-behind (at most every second), then written
for good at response_done, at a stop and at the turn's end (a turn's last response by the transaction
that ends the turn: one write for both). Tool rows are written when the tool starts
and when it ends, so a crash never loses a result that was announced.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from sqlmodel.ext.asyncio.session import AsyncSession

from app.errors import STORAGE_FULL_RETRY_AFTER, StorageFailed
from app.errors.storage import storage_refusal
from app.llm.types import ProviderError
from app.protocol.clock import now_iso
from app.protocol.events import (
    QueuedItem,
    QueueUpdated,
    ResponseDone,
    ResponseInfo,
    TokenUsage,
    ToolCall,
    ToolExecEnd,
    ToolExecStart,
    ToolResult,
    TurnStart,
    Usage,
    UserMessage,
    clean_text,
)
from app.protocol.ids import new_message_id
from app.protocol.schemas import QueuedMessage
from app.storage import repository
from app.streaming.fencing import LeaseLost
from app.streaming.texts import TextBuffer
from app.turns.agent import (
    AgentError,
    AgentEvent,
    AgentRun,
    BreakpointReached,
    ResponseFinished,
    ResponseStarted,
    TextChunk,
    ToolFinished,
    ToolStarted,
)
from app.turns.calls import ApprovedStarting, InputAnswered, InputRequested
from app.turns.ends import REFUSED_MESSAGE, TOOL_INTERRUPTED_BY_RESTART, OpenTool
from app.turns.wait_log import WaitLog

log = logging.getLogger(__name__)


def failure_of(
    exc: Exception, turn_id: str, *, logger: logging.Logger = log, what: str = "failed"
) -> tuple[str, str]:
    """The code and message of the `error` that ends a turn an unexpected exception stopped: storage
    refusing work says so (storage_full, storage_busy, storage_error), anything else is internal. The
    cause goes to `logger`, never to clients."""
    refusal = storage_refusal(exc)
    if refusal is None:
        logger.exception("turn %s %s", turn_id, what)
        return "internal_error", "The turn failed because of an internal error."
    logger.error("turn %s stopped: storage refused a write (%s: %s)", turn_id, refusal.code, exc)
    return refusal.code, f"The turn stopped because the server could not store it: {refusal.message}"


@dataclass
class TurnRecorder(WaitLog):
    # A shutdown while calls wait: the task ends without closing the turn, which resumes after the
    # restart from its rows (turns.resume).
    _detach: bool = False
    # Multi-replica mode: claims the turn's lease, first thing in the transaction that opens it
    # (turns.leased_runner); raises TurnBusy when another turn of the session runs.
    claim: Callable[[AsyncSession], Awaitable[None]] | None = None

    @property
    def detached(self) -> bool:
        """A shutdown ended the task while the turn waits for answers: it is not closed, it goes on after
        the restart (or, with several replicas, on the first replica whose sweeper takes it over)."""
        return self._detach and self.suspended

    def request_stop(self, *, by_server: bool = False) -> bool:
        """Stops the turn as soon as no write is in progress. False when it is already ending by itself.
        A stop `by_server` (shutdown) records the turn as interrupted rather than cancelled, or leaves it
        suspended when it waits for answers."""
        if by_server:
            self.stop_status = "interrupted"
            self.stop_tool_result = TOOL_INTERRUPTED_BY_RESTART
            self._detach = self.suspended
        if self._finishing:
            return False
        if not self._stop_requested:
            self._stop_requested = True
            if self._begun and not self._writing and not self._ending and self.task is not None:
                self.task.cancel()
        return True

    def begin(self) -> bool:
        """Called first by the turn's task: from now on a stop cancels it. True when a stop came before."""
        self._begun = True
        return self._stop_requested

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
                client_tools=[t.model_dump(mode="json") for t in m.client_tools] if m.client_tools else None,
            )
            for m in messages
        ]
        async with self._transaction() as db:
            if self.claim is not None:
                await self.claim(db)
            if waiting is not None:
                await repository.dequeue(db, [m.id for m in messages])
            renamed = await repository.insert_messages(db, [start, *users], new_message_id)
            for m in messages:  # a message whose id another row held: the row's fresh id is its id now
                m.id = renamed.get(m.id, m.id)
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
        """Runs the agent to the end of the turn; every way out closes the turn exactly once, and every
        end is written even when storage refuses it for a while (end_durably)."""
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
            if self._detach and self.suspended:
                self.closed = True  # not here: the turn goes on after the restart
                return
            await self.end_durably(self.finish_cancelled)
            return
        except LeaseLost:
            # Stopped by a write the fence refused: the turn is another replica's to close.
            self._finishing = True
            await events.aclose()
            return
        except (ProviderError, AgentError) as exc:
            self._finishing = True
            await events.aclose()
            failed = (exc.code, exc.message)
            await self.end_durably(lambda: self.finish_failed(*failed))
            return
        except Exception as exc:
            self._finishing = True
            await events.aclose()
            code, message = failure_of(exc, self.turn_id)
            await self.end_durably(lambda: self.finish_failed(code, message))
            return
        await self.end_durably(lambda: self.close("completed"))

    async def _on(self, event: AgentEvent) -> None:
        if type(event) is TextChunk:
            # The hot path. No write: the first delta's row is inserted by the next commit.
            if self.writer.failure is not None:
                # Storage refuses the batches: stop the model rather than stream on into memory.
                raise self.writer.failure
            refused = self.writer.refused(self.session_id)
            if refused is not None:
                raise StorageFailed(REFUSED_MESSAGE, retry_after=STORAGE_FULL_RETRY_AFTER) from refused
            text = clean_text(event.text)
            buffer = self._text
            if buffer is None:
                self._on_first_text(text)
                await self.writer.opened(self.session_id)
            else:
                buffer.parts.append(text)
                self.events.text_delta(buffer.message_id, text)
            return
        with self._atomic():
            await self._dispatch(event)

    async def _dispatch(self, event: AgentEvent) -> None:
        if self.deferred is not None:
            await self._write_deferred()
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
        elif isinstance(event, InputRequested):
            await self.on_input_requested(event)
        elif isinstance(event, InputAnswered):
            await self.on_input_answered(event)
        elif isinstance(event, ApprovedStarting):
            await self.on_approved_starting(event)
        elif isinstance(event, BreakpointReached):
            pass

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
        self.events.text_delta(buffer.message_id, text, timestamp=self._text_timestamp, model=self.model)
        self.writer.track(buffer)

    async def _on_response_done(self, event: ResponseFinished) -> None:
        buffer, self._text = self._text, None
        usage = event.usage
        at = now_iso()

        async def write(db: AsyncSession) -> None:
            if buffer is not None:
                self.writer.untrack(buffer)
                await repository.update_message(
                    db,
                    buffer.message_id,
                    {
                        "content": buffer.text(),
                        "duration_ms": event.duration_ms,
                        "first_token_ms": event.first_token_ms,
                    },
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

        if not event.calls:
            # The turn's last response (the agent ends after a response without calls): written by the
            # transaction that ends the turn, whichever end it is, so a turn costs one write less.
            self.deferred = write
            return
        async with self._transaction() as db:
            await write(db)

    def _announce_response(
        self, buffer: TextBuffer | None, event: ResponseFinished, totals: tuple[int, int] | None
    ) -> None:
        usage = event.usage
        self._emit(
            ResponseDone,
            id=buffer.message_id if buffer is not None else None,
            duration_ms=event.duration_ms,
            first_token_ms=event.first_token_ms,
            response=ResponseInfo(
                model=self.model,
                finish_reason=event.finish_reason,
                usage=Usage(
                    prompt_tokens=usage.prompt_tokens,
                    completion_tokens=usage.completion_tokens,
                    total_tokens=usage.prompt_tokens + usage.completion_tokens,
                    estimated=usage.estimated,
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
                estimated=usage is not None and usage.estimated,
            )

    # --- tools ---------------------------------------------------------------------------------------

    async def _on_tool_start(self, event: ToolStarted) -> None:
        call = event.call
        row = self._tool_row(
            call,
            now_iso(),
            source=event.source,
            executed_by="client" if event.waits_for == "client" else "server",
        )
        async with self._transaction() as db:
            await repository.insert_messages(db, [row], new_message_id)
            self._emit(
                ToolExecStart,
                id=row.id,
                tool_call=ToolCall(id=call.id, name=call.name, arguments=row.arguments),
                timestamp=row.timestamp,
                model=self.model,
                source=event.source,
            )
            if event.waits_for is None:
                self.set_status("tool_calling", call.name)
        self._open_tools[call.id] = OpenTool(row.id, call.name, event.source)
        self._started_calls.add(call.id)

    async def _on_tool_end(self, event: ToolFinished) -> None:
        tool = self._open_tools.pop(event.call.id)
        outcome = event.outcome
        values = {"result": outcome.content, "is_error": outcome.is_error, "duration_ms": event.duration_ms}
        async with self._transaction() as db:
            await repository.update_message(
                db,
                tool.row_id,
                values
                | {"truncated": outcome.truncated}
                | ({"interrupted": True} if event.interrupted else {}),
            )
            self._emit(
                ToolExecEnd,
                id=tool.row_id,
                tool_result=ToolResult(
                    tool_call_id=event.call.id, content=outcome.content, is_error=outcome.is_error
                ),
                timestamp=now_iso(),
                duration_ms=event.duration_ms,
                source=tool.source,
                truncated=outcome.truncated,
            )
            self.settle_status()
