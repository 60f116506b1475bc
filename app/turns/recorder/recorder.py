"""Records one running turn: agent events become chat_messages rows (docs/protocol.md) and enriched
wire events. It is the only writer of a turn's rows and events, and it is made of parts, each with one
job and its own state:

- TurnRows (rows): the turn's identity, its transaction and publisher, its rows, its opening;
- OpenRound (round): the response that streams and the calls of the current tool round;
- ToolRequests (requests): calls that wait for a person or a client, their requests and answers;
- TurnStop (stop): the stop protocol, a stop taking effect only between the recorder's writes;
- TurnEnds (ends): every way the turn ends, one transaction each (also used alone by recovery).

This class runs the agent's events through them. Text is accumulated in memory: the row this class
builds at a response's first text is inserted by the write-behind's next commit, with the first delta's
event (no transaction per delta), and its text refreshed there at most every second; this class writes
it for good at response_done, at a stop and at the turn's end (a turn's last response by the transaction
that ends the turn: one write for both). Tool rows are written when the tool starts and when it ends, so
a crash never loses a result that was announced.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from sqlmodel.ext.asyncio.session import AsyncSession

from app.errors import STORAGE_FULL_RETRY_AFTER, StorageFailed, StorageUnavailable
from app.errors.storage import storage_refusal
from app.llm.types import ProviderError
from app.protocol.clock import now_iso
from app.protocol.events import (
    ContextCompacted as ContextCompactedEvent,
)
from app.protocol.events import (
    QueuedItem,
    ReasoningDelta,
    ResponseDone,
    ResponseInfo,
    TokenUsage,
    ToolCall,
    ToolExecEnd,
    ToolExecStart,
    ToolResult,
    TurnStatus,
    Usage,
    clean_text,
)
from app.protocol.ids import new_message_id
from app.protocol.schemas import QueuedMessage
from app.storage import compaction, repository
from app.storage.tables import ChatMessageRow, ContextSummaryRow, ContextViewRow
from app.streaming.frames import Publisher
from app.streaming.log.fencing import LeaseLost
from app.streaming.log.texts import TextBuffer
from app.streaming.log.write_behind import WriteBehind
from app.turns.agent import (
    AgentError,
    AgentEvent,
    AgentRun,
    BreakpointReached,
    ContextCompacted,
    ReasoningChunk,
    ResponseFinished,
    ResponseStarted,
    TextChunk,
    ToolFinished,
    ToolStarted,
)
from app.turns.agent_events import ApprovedStarting, InputAnswered, InputRequested
from app.turns.live import LiveStatusBoard
from app.turns.recorder.ends import REFUSED_MESSAGE, TurnEnds
from app.turns.recorder.requests import ToolRequests
from app.turns.recorder.round import OpenRound, OpenTool
from app.turns.recorder.rows import BranchFrom, Claim, TurnRows
from app.turns.recorder.stop import TurnStop

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


class TurnRecorder:
    """One turn's recorder: its parts, and the agent's events run through them (see the module)."""

    def __init__(
        self,
        writer: WriteBehind,
        events: Publisher,
        live: LiveStatusBoard,
        session_id: str,
        turn_id: str,
        model: str,
        *,
        context_window: int | None = None,
        taken_ids: frozenset[str] = frozenset(),
        started: float | None = None,
        claim: Claim | None = None,
    ) -> None:
        self.rows = TurnRows(writer, events, live, session_id, turn_id, model)
        self.round = OpenRound()
        self.requests = ToolRequests(self.rows, self.round)
        self.stop = TurnStop()
        self.ends = TurnEnds(
            self.rows,
            self.round,
            self.stop,
            self.requests,
            started=time.monotonic() if started is None else started,
        )
        # The hot path (a text delta) reads these directly: the same objects as the rows'.
        self.writer, self.events = writer, events
        self.context_window = context_window
        # The ids of the messages the turn took (the runner answers a message's waiters with its turn).
        self.taken_ids = taken_ids
        # Multi-replica mode: claims the turn's lease, first thing in the transaction that opens it
        # (turns.replicas.ownership); raises TurnBusy when another turn of the session runs.
        self.claim = claim

    # --- what the runner and the API read ------------------------------------------------------------

    @property
    def session_id(self) -> str:
        return self.rows.session_id

    @property
    def turn_id(self) -> str:
        return self.rows.turn_id

    @property
    def model(self) -> str:
        return self.rows.model

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self.stop.task

    @task.setter
    def task(self, task: asyncio.Task[None] | None) -> None:
        self.stop.task = task

    @property
    def closed(self) -> bool:
        return self.ends.closed

    @property
    def closed_status(self) -> TurnStatus | None:
        return self.ends.closed_status

    @property
    def stalled(self) -> StorageUnavailable | None:
        return self.ends.stalled

    @property
    def interrupted_message_ids(self) -> list[str]:
        return self.ends.interrupted_message_ids

    @property
    def interrupted_tool_call_ids(self) -> list[str]:
        return self.ends.interrupted_tool_call_ids

    @property
    def suspended(self) -> bool:
        return self.requests.suspended

    @property
    def detached(self) -> bool:
        """A shutdown ended the task while the turn waits for answers: it is not closed, it goes on after
        the restart (or, with several replicas, on the first replica whose sweeper takes it over)."""
        return self.stop.detach and self.requests.suspended

    # --- the stop protocol (TurnStop) and the ends (TurnEnds) ----------------------------------------

    def request_stop(self, *, by_server: bool = False) -> bool:
        """Stops the turn as soon as no write is in progress. False when it is already ending by itself.
        A stop `by_server` (shutdown) records the turn as interrupted rather than cancelled, or leaves it
        suspended when it waits for answers."""
        return self.stop.request(by_server=by_server, suspended=self.requests.suspended)

    def begin(self) -> bool:
        """Called first by the turn's task: from now on a stop cancels it. True when a stop came before."""
        return self.stop.begin()

    async def finish_cancelled(self) -> None:
        await self.ends.finish_cancelled()

    async def finish_failed(self, code: str, message: str, *, retry_after: float | None = None) -> None:
        await self.ends.finish_failed(code, message, retry_after=retry_after)

    async def close(self, status: TurnStatus) -> None:
        await self.ends.close(status)

    async def end_durably(self, end: Callable[[], Awaitable[None]]) -> None:
        await self.ends.end_durably(end)

    async def stall(self) -> StorageUnavailable:
        return await self.ends.stall()

    # --- the turn ------------------------------------------------------------------------------------

    def adopt_round(self, rows: Sequence[ChatMessageRow]) -> None:
        """A turn resumed after a restart: its last round's calls without a result are open again."""
        self.round.adopt(rows)

    async def open(
        self,
        messages: Sequence[QueuedMessage],
        *,
        waiting: list[QueuedItem] | None = None,
        branch: BranchFrom | None = None,
    ) -> None:
        """Starts the turn: its turn_start and the user messages it takes, with their events, in one
        transaction (TurnRows.open, under `claim`). `waiting` is the waiting line once the messages left
        it, when they come from it; `branch`, the parent of a regenerated or edited turn."""
        await self.rows.open(messages, waiting=waiting, claim=self.claim, branch=branch)

    async def record(self, agent: AgentRun) -> None:
        """Runs the agent to the end of the turn; every way out closes the turn exactly once, and every
        end is written even when storage refuses it for a while (end_durably)."""
        self.context_window = agent.model.context_window
        events = agent.run()
        try:
            async for event in events:
                await self._on(event)
        except asyncio.CancelledError:
            self.stop.finishing = True
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            # Close the agent first: that closes the provider stream and cancels running tools.
            await events.aclose()
            if self.stop.detach and self.requests.suspended:
                self.ends.closed = True  # not here: the turn goes on after the restart
                return
            await self.end_durably(self.finish_cancelled)
            return
        except LeaseLost:
            # Stopped by a write the fence refused: the turn is another replica's to close.
            self.stop.finishing = True
            await events.aclose()
            return
        except (ProviderError, AgentError) as exc:
            self.stop.finishing = True
            await events.aclose()
            failed = (exc.code, exc.message)
            wait = exc.retry_after if isinstance(exc, ProviderError) else None
            await self.end_durably(lambda: self.finish_failed(*failed, retry_after=wait))
            return
        except Exception as exc:
            self.stop.finishing = True
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
            buffer = self.round.text
            if buffer is None:
                self._on_first_text(text)
                await self.writer.opened(self.session_id)
            else:
                buffer.parts.append(text)
                self.events.text_delta(buffer.message_id, text)
            return
        if type(event) is ReasoningChunk:
            await self._on_reasoning(event)
            return
        with self.stop.atomic():
            await self._dispatch(event)

    async def _dispatch(self, event: AgentEvent) -> None:
        if self.ends.deferred is not None:
            await self.ends.write_deferred()
        if isinstance(event, ResponseStarted):
            self.round.response_id = new_message_id()
            self.round.text = self.round.reasoning = None
        elif isinstance(event, ResponseFinished):
            self.round.calls, self.round.started = list(event.calls), set()
            await self._on_response_done(event)
        elif isinstance(event, ToolStarted):
            await self._on_tool_start(event)
        elif isinstance(event, ToolFinished):
            await self._on_tool_end(event)
        elif isinstance(event, InputRequested):
            await self.requests.on_input_requested(event)
        elif isinstance(event, InputAnswered):
            await self.requests.on_input_answered(event)
        elif isinstance(event, ApprovedStarting):
            await self.requests.on_approved_starting(event)
        elif isinstance(event, ContextCompacted):
            await self._on_context_compacted(event)
        elif isinstance(event, BreakpointReached):
            pass

    async def _on_context_compacted(self, event: ContextCompacted) -> None:
        """What the next model call sends instead of the whole history, and the summary it was written
        for, stored with the event that announces them in one transaction: a summary is whole or absent."""
        at = now_iso()
        summary = event.summary
        summarized = list(summary.turn_ids) if summary is not None else []
        async with self.rows.transaction() as db:
            if event.written and summary is not None:
                row = ContextSummaryRow(
                    id=summary.id,
                    session_id=self.session_id,
                    through_turn_id=summary.through_turn_id,
                    turn_ids=summarized,
                    previous_id=event.previous_summary_id,
                    content=summary.content,
                    turn_id=self.turn_id,
                    model=event.summary_model,
                    created_at=at,
                )
                await compaction.insert_summary(db, row)
            view = ContextViewRow(
                session_id=self.session_id,
                turn_id=self.turn_id,
                summary_id=summary.id if summary is not None else None,
                summarized_turn_ids=summarized,
                elided_tool_call_ids=list(event.elided_tool_call_ids),
                elided_file_ids=list(event.elided_file_ids),
                tokens_before=event.tokens_before,
                tokens_after=event.tokens_after,
                created_at=at,
            )
            await compaction.insert_view(db, view)
            self.rows.emit(
                ContextCompactedEvent,
                turn_id=self.turn_id,
                tokens_before=event.tokens_before,
                tokens_after=event.tokens_after,
                summarized_turn_ids=summarized,
                elided_tool_call_ids=list(event.elided_tool_call_ids),
                elided_file_ids=list(event.elided_file_ids),
                summary_id=summary.id if summary is not None else None,
                summary_written=event.written,
            )

    # --- model text ----------------------------------------------------------------------------------

    def _on_first_text(self, text: str) -> None:
        """Opens the message: its row is inserted by the next commit (the write-behind's batch, or this
        turn's next write), which also commits this first delta's event, so neither is seen without
        the other."""
        response_id = self.round.response_id
        assert response_id is not None
        at = now_iso()
        row = self.rows.row(
            "text",
            at,
            id=response_id,
            role="assistant",
            content=text,
            model=self.model,
            response_id=response_id,
        )
        buffer = self.round.text = TextBuffer(row)
        self.events.text_delta(buffer.message_id, text, timestamp=at, model=self.model)
        self.writer.track(buffer)

    async def _on_reasoning(self, event: ReasoningChunk) -> None:
        """Reasoning streams as text does (no write per delta): its `reasoning` row opens at its first
        delta and is written behind; its event goes out with the commit that inserts the row."""
        if self.writer.failure is not None:
            raise self.writer.failure
        refused = self.writer.refused(self.session_id)
        if refused is not None:
            raise StorageFailed(REFUSED_MESSAGE, retry_after=STORAGE_FULL_RETRY_AFTER) from refused
        text = clean_text(event.text)
        buffer = self.round.reasoning
        if buffer is not None:
            buffer.parts.append(text)
            self.rows.emit(ReasoningDelta, id=buffer.message_id, text=text)
            return
        at = now_iso()
        row = self.rows.row(
            "reasoning",
            at,
            role="assistant",
            content=text,
            model=self.model,
            response_id=self.round.response_id,
        )
        buffer = self.round.reasoning = TextBuffer(row)
        self.rows.emit(ReasoningDelta, id=row.id, text=text, timestamp=at, model=self.model)
        self.writer.track(buffer)
        await self.writer.opened(self.session_id)

    async def _on_response_done(self, event: ResponseFinished) -> None:
        buffer, self.round.text = self.round.text, None
        reasoning, self.round.reasoning = self.round.reasoning, None
        usage = event.usage
        at = now_iso()

        async def write(db: AsyncSession) -> None:
            if reasoning is not None:
                self.writer.untrack(reasoning)
                # The provider's signed or redacted blocks kept in `arguments`, never shown to clients
                # (docs/protocol.md, reasoning).
                await repository.update_message(
                    db,
                    reasoning.message_id,
                    {
                        "content": reasoning.text(),
                        "duration_ms": event.reasoning_ms,
                        "arguments": {"thinking_blocks": event.thinking_blocks}
                        if event.thinking_blocks
                        else None,
                    },
                )
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
                    context_scale=event.context_scale,  # only ever set with a reported usage
                )
            self._announce_response(buffer, event, totals)

        if not event.calls:
            # The turn's last response (the agent ends after a response without calls): written by the
            # transaction that ends the turn, whichever end it is, so a turn costs one write less.
            self.ends.deferred = write
            return
        async with self.rows.transaction() as db:
            await write(db)

    def _announce_response(
        self, buffer: TextBuffer | None, event: ResponseFinished, totals: tuple[int, int] | None
    ) -> None:
        usage = event.usage
        self.rows.emit(
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
                    cache_read_tokens=usage.cache_read_tokens,
                    cache_write_tokens=usage.cache_write_tokens,
                    reasoning_tokens=usage.reasoning_tokens,
                )
                if usage is not None
                else None,
            ),
        )
        if totals is not None:
            total, used = totals
            window = self.context_window
            self.rows.emit(
                TokenUsage,
                context_used=used,
                context_window=window,
                context_percent=round(used * 100 / window, 1) if window else None,
                session_total_tokens=total,
                model=self.model,
                estimated=usage is not None and usage.estimated,
                cache_read_tokens=usage.cache_read_tokens if usage is not None else 0,
                cache_write_tokens=usage.cache_write_tokens if usage is not None else 0,
            )

    # --- tools ---------------------------------------------------------------------------------------

    async def _on_tool_start(self, event: ToolStarted) -> None:
        call = event.call
        row = self.rows.tool_row(
            call,
            self.round.response_id,
            now_iso(),
            source=event.source,
            executed_by="client" if event.waits_for == "client" else "server",
        )
        async with self.rows.transaction() as db:
            await repository.insert_messages(db, [row], new_message_id)
            self.rows.emit(
                ToolExecStart,
                id=row.id,
                tool_call=ToolCall(id=call.id, name=call.name, arguments=row.arguments),
                timestamp=row.timestamp,
                model=self.model,
                source=event.source,
            )
            if event.waits_for is None:
                self.rows.set_status("tool_calling", call.name)
        self.round.tools[call.id] = OpenTool(row.id, call.name, event.source)
        self.round.started.add(call.id)

    async def _on_tool_end(self, event: ToolFinished) -> None:
        tool = self.round.tools.pop(event.call.id)
        outcome = event.outcome
        values = {"result": outcome.content, "is_error": outcome.is_error, "duration_ms": event.duration_ms}
        async with self.rows.transaction() as db:
            await repository.update_message(
                db,
                tool.row_id,
                values
                | {"truncated": outcome.truncated}
                | ({"interrupted": True} if event.interrupted else {}),
            )
            self.rows.emit(
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
            self.requests.settle_status()
