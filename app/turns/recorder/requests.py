"""The recorder's part for calls that wait outside the service: their pending_tool_requests rows, their
tool_group rows' decision and waiting time, and the events that announce them (docs/protocol.md: a
tool_group row says who ran it, the person's decision, and the wait apart from the execution).

Every answer is committed with its events before the request that gave it gets its reply; a stop gives
every call still waiting its interrupted result and closes its request (`abandon`, in the end's
transaction).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlmodel.ext.asyncio.session import AsyncSession

from app.protocol.clock import now_iso
from app.protocol.events import (
    AgentState,
    ApprovalRequested,
    ApprovalResolved,
    ClientToolRequested,
    ClientToolResolved,
    ToolExecEnd,
    ToolResult,
)
from app.storage import pending, repository
from app.storage.tables import PendingToolRequestRow
from app.turns.agent_events import ApprovedStarting, InputAnswered, InputRequested
from app.turns.pending_calls import DECISIONS, Answer, Waiting
from app.turns.recorder.round import OpenRound
from app.turns.recorder.rows import TurnRows


@dataclass
class ToolRequests:
    rows: TurnRows
    round: OpenRound
    # Calls of the round that wait for an answer (their tool_group rows are open tools too).
    waiting: dict[str, Waiting] = field(default_factory=dict)
    # Their tool_group rows (a stop takes the open tools before it closes the requests).
    wait_rows: dict[str, str] = field(default_factory=dict)

    @property
    def suspended(self) -> bool:
        return bool(self.waiting)

    def settle_status(self) -> None:
        """tool_calling while a server tool of the round runs, else awaiting_input while calls wait, else
        thinking; announced only when it changed (an approval's answer and the approved call's start both
        settle it, and a round's tools end one by one)."""
        running = [t for call_id, t in self.round.tools.items() if call_id not in self.waiting]
        status: tuple[AgentState, str | None]
        if running:
            status = ("tool_calling", running[0].name)
        elif self.waiting:
            status = ("awaiting_input", None)
        else:
            status = ("thinking", None)
        if status != self.rows.status:
            self.rows.set_status(*status)

    async def on_input_requested(self, event: InputRequested) -> None:
        self.waiting.update({w.call_id: w for w in event.waiting})
        self.wait_rows.update({w.call_id: self.round.tools[w.call_id].row_id for w in event.waiting})
        async with self.rows.transaction() as db:
            if not event.resumed:
                await pending.insert(db, [self._request_row(w) for w in event.waiting])
                for w in event.waiting:
                    self._announce_request(w)
            self.settle_status()

    def _request_row(self, w: Waiting) -> PendingToolRequestRow:
        return PendingToolRequestRow(
            session_id=self.rows.session_id,
            turn_id=self.rows.turn_id,
            tool_call_id=w.call_id,
            message_id=self.wait_rows[w.call_id],
            kind=w.kind,
            tool_name=w.name,
            arguments=w.arguments,
            requested_at=w.requested_at,
            expires_at=w.expires_at,
        )

    def _announce_request(self, w: Waiting) -> None:
        common: dict[str, Any] = {
            "id": self.wait_rows[w.call_id],
            "turn_id": self.rows.turn_id,
            "tool_call_id": w.call_id,
            "name": w.name,
            "arguments": w.arguments,
            "expires_at": w.expires_at,
        }
        if w.kind == "client":
            self.rows.emit(ClientToolRequested, **common)
        else:
            self.rows.emit(ApprovalRequested, **common, decisions=DECISIONS)

    async def on_input_answered(self, event: InputAnswered) -> None:
        at = now_iso()
        async with self.rows.transaction() as db:
            for answer, waiting in zip(event.answers, event.waiting, strict=True):
                await self._record_answer(db, answer, waiting, at)
            self.settle_status()
        if event.submission is not None and not event.submission.future.done():
            event.submission.future.set_result(event.replies)

    async def _record_answer(self, db: AsyncSession, answer: Answer, w: Waiting, at: str) -> None:
        state = "expired" if answer.resolution == "expired" else "answered"
        values = {"state": state, "decision": answer.resolution, "answer": answer.given, "answered_at": at}
        await pending.update_request(db, self.rows.turn_id, w.call_id, values)
        row_id = self.wait_rows[w.call_id]
        row: dict[str, Any] = {}
        if w.kind == "approval":
            row = {"decision": answer.resolution, "wait_ms": answer.wait_ms}
            arguments = answer.given.get("arguments") if answer.given else None
            if arguments is not None:
                await pending.set_tool_arguments(db, row_id, arguments)
            self.rows.emit(
                ApprovalResolved,
                id=row_id,
                turn_id=self.rows.turn_id,
                tool_call_id=w.call_id,
                decision=answer.resolution,
                arguments=arguments if arguments is not None else w.arguments,
                reason=answer.reason,
                wait_ms=answer.wait_ms,
            )
        else:
            self.rows.emit(
                ClientToolResolved,
                id=row_id,
                turn_id=self.rows.turn_id,
                tool_call_id=w.call_id,
                resolution=answer.resolution,
                is_error=answer.outcome is None or answer.outcome.is_error,
                wait_ms=answer.wait_ms,
            )
        outcome = answer.outcome
        if outcome is not None:
            # A client's execution is its wait; a reject or an expiry ran nothing.
            duration_ms = answer.wait_ms if w.kind == "client" else 0
            row |= {"result": outcome.content, "is_error": outcome.is_error, "duration_ms": duration_ms}
            row |= {"truncated": outcome.truncated}
            tool = self.round.tools.pop(w.call_id, None)
            self.rows.emit(
                ToolExecEnd,
                id=row_id,
                tool_result=ToolResult(
                    tool_call_id=w.call_id, content=outcome.content, is_error=outcome.is_error
                ),
                timestamp=at,
                duration_ms=duration_ms,
                # A round adopted after a restart does not know its tools' sources; a client's is known.
                source="client" if w.kind == "client" else tool.source if tool else "builtin",
                truncated=outcome.truncated,
            )
        if row:
            await repository.update_message(db, row_id, row)
        del self.waiting[w.call_id]

    async def on_approved_starting(self, event: ApprovedStarting) -> None:
        async with self.rows.transaction() as db:
            for call_id in event.call_ids:
                await pending.update_request(db, self.rows.turn_id, call_id, {"state": pending.RUNNING})
            self.settle_status()

    async def abandon(self, db: AsyncSession, tool_result: str) -> None:
        """A stop, a failure or a shutdown that ends the turn: every call still waiting is closed with
        the result the stop gives the round's open calls (written by the caller)."""
        at = now_iso()
        for w in list(self.waiting.values()):
            await pending.update_request(
                db,
                self.rows.turn_id,
                w.call_id,
                {"state": "interrupted", "decision": "interrupted", "answered_at": at},
            )
            row_id = self.wait_rows[w.call_id]
            if w.kind == "approval":
                await repository.update_message(
                    db, row_id, {"decision": "interrupted", "wait_ms": w.waited_ms()}
                )
                self.rows.emit(
                    ApprovalResolved,
                    id=row_id,
                    turn_id=self.rows.turn_id,
                    tool_call_id=w.call_id,
                    decision="interrupted",
                    arguments=w.arguments,
                    reason=tool_result,
                    wait_ms=w.waited_ms(),
                )
            else:
                self.rows.emit(
                    ClientToolResolved,
                    id=row_id,
                    turn_id=self.rows.turn_id,
                    tool_call_id=w.call_id,
                    resolution="interrupted",
                    is_error=True,
                    wait_ms=w.waited_ms(),
                )
        self.waiting.clear()
        # Also what this process never took up (a resumed turn that failed before its round went on).
        await pending.close_turn_requests(db, self.rows.turn_id, at)
