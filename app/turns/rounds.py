"""One tool round of the agent loop: the calls of a model response, run, waited for, or both.

Server tools run at once, concurrently. A client tool's call and a call that needs approval wait: the
round announces them (InputRequested), and the turn is suspended until the turn's inbox brings answers or
their time runs out. Which calls need approval is the registry's decision from the tool each call resolves
to (the agent passes it in), and the round tells the executor which calls a person approved: the registry
runs no guarded call that was not. Answers are checked (turns.pending_calls) and recorded before the request
that gave them gets its reply; an approved call runs as soon as it is approved. The round ends once every
call has its outcome, in call order for the history.

A round can also be resumed after a restart from what its rows say (ResumedRound): calls with a result
keep it, calls still waiting wait again with their original expiry, approved calls that had not started
run, and calls that were running when the process died get the interrupted result they were given.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from app.tools.registry import ToolOutcome
from app.turns.agent_events import (
    AgentEvent,
    ApprovedStarting,
    CallRequest,
    InputAnswered,
    InputRequested,
    ToolFinished,
    ToolStarted,
)
from app.turns.pending_calls import (
    Answer,
    AnswerRefused,
    ArgumentCheck,
    Inbox,
    Kind,
    NoPendingCall,
    Submission,
    Waiting,
    check,
    expired_outcome,
    expiry,
)

Executed = tuple[CallRequest, ToolOutcome, int]
# Runs a call; the flag says a person approved it (an unapproved call of a guarded tool is refused).
Execute = Callable[[CallRequest, bool], Coroutine[Any, Any, Executed]]


@dataclass
class ResumedRound:
    calls: list[CallRequest]
    outcomes: dict[str, ToolOutcome] = field(default_factory=dict)
    # Calls running when the process died: the result they get now (never run again).
    interrupted: dict[str, ToolOutcome] = field(default_factory=dict)
    waiting: list[Waiting] = field(default_factory=list)
    # Approved (call id → the arguments to run with) but not started before the restart.
    approved: dict[str, str] = field(default_factory=dict)


@dataclass
class WaitRules:
    """Which calls wait, and for how long."""

    client_tools: frozenset[str] = frozenset()
    # The session's own approval names ("*", a tool, a server); the tools file's rule is the registry's.
    approval: frozenset[str] = frozenset()
    client_timeout: float = 900.0
    approval_timeout: float = 900.0
    validate: ArgumentCheck = field(default=lambda _name, _args: None)

    def timeout(self, kind: Kind) -> float:
        return self.client_timeout if kind == "client" else self.approval_timeout


class ToolRound:
    def __init__(
        self,
        rules: WaitRules,
        inbox: Inbox | None,
        execute: Execute,
        needs_approval: Callable[[str], bool],
        source_of: Callable[[str], str] = lambda _name: "builtin",
    ) -> None:
        self._rules = rules
        self._inbox = inbox or Inbox()
        self._execute = execute
        self._source_of = source_of
        self._needs_approval = needs_approval
        self.outcomes: dict[str, ToolOutcome] = {}
        # Calls a person edited: the arguments they ran with (the history shows those).
        self.edited: dict[str, str] = {}
        self._calls: dict[str, CallRequest] = {}
        self._waiting: dict[str, Waiting] = {}
        self._tasks: set[asyncio.Task[Executed]] = set()

    async def run(self, calls: list[CallRequest]) -> AsyncGenerator[AgentEvent, None]:
        try:
            async for event in self._run(calls):
                yield event
        finally:
            await self._cancel_tools()

    async def resume(self, plan: ResumedRound) -> AsyncGenerator[AgentEvent, None]:
        try:
            async for event in self._resume(plan):
                yield event
        finally:
            await self._cancel_tools()

    async def _run(self, calls: list[CallRequest]) -> AsyncGenerator[AgentEvent, None]:
        self._calls = {call.id: call for call in calls}
        for call in calls:
            kind = self._kind(call)
            yield ToolStarted(call, kind, "client" if kind == "client" else self._source_of(call.name))
            if kind is None:
                self._start(call, approved=False)
                continue
            requested_at, expires_at = expiry(self._rules.timeout(kind))
            waiting = Waiting(call.id, call.name, call.arguments, kind, requested_at, expires_at)
            self._waiting[call.id] = waiting
        if self._waiting:
            self._inbox.open()
            yield InputRequested(list(self._waiting.values()))
        async for event in self._drive():
            yield event

    async def _resume(self, plan: ResumedRound) -> AsyncGenerator[AgentEvent, None]:
        self._calls = {call.id: call for call in plan.calls}
        self.outcomes.update(plan.outcomes)
        for call_id, outcome in plan.interrupted.items():
            self.outcomes[call_id] = outcome
            yield ToolFinished(self._calls[call_id], outcome, 0, interrupted=True)
        self._waiting = {w.call_id: w for w in plan.waiting}
        if self._waiting:
            self._inbox.open()
            yield InputRequested(plan.waiting, resumed=True)
        if plan.approved:
            yield ApprovedStarting(list(plan.approved))
            for call_id, arguments in plan.approved.items():
                self._start(CallRequest(call_id, self._calls[call_id].name, arguments), approved=True)
        async for event in self._drive():
            yield event

    def _kind(self, call: CallRequest) -> Kind | None:
        if call.name in self._rules.client_tools:
            return "client"
        return "approval" if self._needs_approval(call.name) else None

    def _start(self, call: CallRequest, *, approved: bool) -> None:
        self._tasks.add(asyncio.create_task(self._execute(call, approved), name=f"tool:{call.name}"))

    def _open(self) -> list[Waiting]:
        return [w for w in self._waiting.values() if w.answer is None]

    async def _drive(self) -> AsyncGenerator[AgentEvent, None]:
        getter: asyncio.Task[Submission] | None = None
        try:
            while self._tasks or self._open():
                if self._open() and getter is None:
                    getter = asyncio.create_task(self._inbox.get())
                timeout = None
                if self._open():
                    timeout = max(0.0, min(w.deadline for w in self._open()) - time.time())
                waits: set[asyncio.Task[Any]] = {*self._tasks, *([getter] if getter else [])}
                done, _ = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                for task in [t for t in self._tasks if t in done]:
                    self._tasks.discard(task)
                    call, outcome, duration_ms = task.result()
                    self.outcomes[call.id] = outcome
                    yield ToolFinished(call, outcome, duration_ms)
                if getter is not None and getter in done:
                    submission, getter = getter.result(), None
                    async for event in self._answer(submission):
                        yield event
                expired = [w for w in self._open() if w.deadline <= time.time()]
                if expired:
                    async for event in self._expire(expired):
                        yield event
        finally:
            await self._drop(getter)

    async def _answer(self, submission: Submission) -> AsyncGenerator[AgentEvent, None]:
        try:
            answers, replies = check(submission, self._waiting, self._rules.validate)
        except AnswerRefused as exc:
            if not submission.future.done():
                submission.future.set_exception(exc)
            return
        if not answers:  # only repeats of answers already taken
            if not submission.future.done():
                submission.future.set_result(replies)
            return
        async for event in self._take(answers, submission, replies):
            yield event

    async def _expire(self, expired: list[Waiting]) -> AsyncGenerator[AgentEvent, None]:
        answers = [
            Answer(w.call_id, "expired", None, expired_outcome(w, self._rules.timeout(w.kind)), w.waited_ms())
            for w in expired
        ]
        async for event in self._take(answers, None, []):
            yield event

    async def _take(
        self, answers: list[Answer], submission: Submission | None, replies: list[Any]
    ) -> AsyncGenerator[AgentEvent, None]:
        for answer in answers:
            self._waiting[answer.call_id].answer = answer
            if answer.outcome is not None:
                self.outcomes[answer.call_id] = answer.outcome
        yield InputAnswered(answers, [self._waiting[a.call_id] for a in answers], submission, replies)
        if not self._open():
            # Committed: an answer racing this one (the same again, or another) is answered from the rows
            # at once, not left in the inbox while the approved calls run or the next response streams.
            self._inbox.shut()
        approved = [a for a in answers if a.resolution in ("approve", "edit")]
        if approved:
            yield ApprovedStarting([a.call_id for a in approved])
            for a in approved:
                call = self._calls[a.call_id]
                if a.arguments_text is not None:
                    self.edited[a.call_id] = a.arguments_text
                self._start(
                    CallRequest(call.id, call.name, a.arguments_text or call.arguments_text), approved=True
                )

    async def _drop(self, getter: asyncio.Task[Submission] | None) -> None:
        """The round is over or abandoned: an answer taken from the inbox but not handled is refused, as
        the turn no longer waits for it."""
        if getter is not None:
            getter.cancel()
            await asyncio.gather(getter, return_exceptions=True)
            if not getter.cancelled() and getter.exception() is None:
                future = getter.result().future
                if not future.done():
                    future.set_exception(NoPendingCall("The turn no longer waits for this answer."))

    async def _cancel_tools(self) -> None:
        """Wait for the cancelled tools to finish their own cleanup before the turn records them."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
