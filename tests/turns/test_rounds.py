"""The tool round's waiting logic without a server: which calls wait, how answers are checked
(turns.pending_calls)
and how a round resumes from a plan (turns.rounds), with a real asyncio inbox and a recording executor."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

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
    AnswerConflict,
    AnswerExpired,
    Inbox,
    InvalidAnswer,
    NoPendingCall,
    Submission,
    Waiting,
    check,
    expiry,
)
from app.turns.rounds import ResumedRound, ToolRound, WaitRules

pytestmark = pytest.mark.anyio

RULES = WaitRules(
    client_tools=frozenset({"where"}),
    client_timeout=30,
    approval_timeout=30,
    validate=lambda _name, args: None if isinstance(args.get("x"), int) else "x: must be an integer",
)


def guarded(name: str) -> bool:
    return name == "guarded"


class Executor:
    def __init__(self) -> None:
        self.ran: list[CallRequest] = []
        self.approved: list[bool] = []

    async def __call__(self, call: CallRequest, approved: bool) -> tuple[CallRequest, ToolOutcome, int]:
        self.ran.append(call)
        self.approved.append(approved)
        return call, ToolOutcome(f"ran {call.name} {call.arguments_text}", is_error=False), 1


async def drive(
    events: AsyncGenerator[AgentEvent, None], inbox: Inbox, answers: list[tuple[str, list[dict[str, Any]]]]
) -> tuple[list[AgentEvent], list[Any]]:
    """Consumes the round as the recorder would; submits `answers` once it asked for input, and plays
    the recorder's part of replying to each submission once its answers are 'recorded'."""
    seen: list[AgentEvent] = []
    futures: list[asyncio.Future[Any]] = []
    async for event in events:
        seen.append(event)
        if isinstance(event, InputRequested):
            futures = [inbox.submit(kind, items) for kind, items in answers]  # type: ignore[arg-type]
        if isinstance(event, InputAnswered) and event.submission is not None:
            event.submission.future.set_result(event.replies)
    replies = [await asyncio.gather(f, return_exceptions=True) for f in futures]
    return seen, [r[0] for r in replies]


async def test_only_client_tools_and_guarded_tools_wait_and_answers_resume_in_order() -> None:
    inbox, execute = Inbox(), Executor()
    round_ = ToolRound(RULES, inbox, execute, guarded)
    calls = [
        CallRequest("a", "free", "{}"),
        CallRequest("b", "where", "{}"),
        CallRequest("c", "guarded", "{}"),
    ]
    answers: list[tuple[str, list[dict[str, Any]]]] = [
        ("approval", [{"tool_call_id": "c", "decision": "edit", "arguments": {"x": 1}}]),
        ("client", [{"tool_call_id": "b", "output": "Paris"}]),
    ]
    seen, replies = await drive(round_.run(calls), inbox, answers)
    assert [e.waits_for for e in seen if isinstance(e, ToolStarted)] == [None, "client", "approval"]
    [requested] = [e for e in seen if isinstance(e, InputRequested)]
    assert [w.call_id for w in requested.waiting] == ["b", "c"]
    assert [e.call_ids for e in seen if isinstance(e, ApprovedStarting)] == [["c"]]
    assert [c.arguments_text for c in execute.ran] == ["{}", '{"x": 1}']  # the edited arguments ran
    assert execute.approved == [False, True]  # the executor knows which call a person approved
    assert round_.outcomes["b"] == ToolOutcome("Paris", is_error=False)
    assert round_.edited == {"c": '{"x": 1}'}
    assert [[r.resolution for r in reply] for reply in replies] == [["edit"], ["answered"]]


async def test_an_expired_call_gives_its_timeout_to_the_model() -> None:
    rules = WaitRules(client_tools=frozenset({"where"}), client_timeout=0.05)
    round_ = ToolRound(rules, Inbox(), Executor(), guarded)
    seen, _ = await drive(round_.run([CallRequest("b", "where", "{}")]), Inbox(), [])
    [answered] = [e for e in seen if isinstance(e, InputAnswered)]
    assert answered.answers[0].resolution == "expired"
    assert round_.outcomes["b"].is_error and "timed out" in round_.outcomes["b"].content


async def test_a_resumed_round_waits_runs_the_approved_and_never_reruns_the_interrupted() -> None:
    inbox, execute = Inbox(), Executor()
    at, until = expiry(30)
    plan = ResumedRound(
        calls=[
            CallRequest(i, n, "{}")
            for i, n in [("a", "free"), ("b", "where"), ("c", "guarded"), ("d", "free")]
        ],
        outcomes={"d": ToolOutcome("done before", is_error=False)},
        interrupted={"a": ToolOutcome("[interrupted]", is_error=True)},
        waiting=[Waiting("b", "where", {}, "client", at, until)],
        approved={"c": '{"x": 2}'},
    )
    seen, _ = await drive(
        ToolRound(RULES, inbox, execute, guarded).resume(plan),
        inbox,
        [("client", [{"tool_call_id": "b", "error": "denied"}])],
    )
    finished = [e for e in seen if isinstance(e, ToolFinished)]
    assert [(e.call.id, e.interrupted) for e in finished] == [("a", True), ("c", False)]
    assert [c.id for c in execute.ran] == ["c"]  # a is not run again
    assert execute.approved == [True]  # c was approved before the restart
    assert any(isinstance(e, InputRequested) and e.resumed for e in seen)


def _waiting(kind: str = "approval", call_id: str = "c", seconds: float = 30) -> dict[str, Waiting]:
    at, until = expiry(seconds)
    return {call_id: Waiting(call_id, "guarded", {}, kind, at, until)}  # type: ignore[arg-type]


async def test_check_refuses_what_does_not_wait_or_does_not_fit() -> None:
    def submit(kind: str, *items: dict[str, Any]) -> Submission:
        return Submission(kind, list(items))  # type: ignore[arg-type]

    validate = RULES.validate
    with pytest.raises(NoPendingCall):
        check(submit("approval", {"tool_call_id": "zz", "decision": "approve"}), _waiting(), validate)
    with pytest.raises(NoPendingCall):  # a client result for an approval request
        check(submit("client", {"tool_call_id": "c", "output": "x"}), _waiting(), validate)
    with pytest.raises(InvalidAnswer):
        check(
            submit("approval", {"tool_call_id": "c", "decision": "edit", "arguments": {"x": "no"}}),
            _waiting(),
            validate,
        )
    item = {"tool_call_id": "c", "decision": "approve"}
    with pytest.raises(InvalidAnswer):  # twice in one request
        check(submit("approval", item, item), _waiting(), validate)
    with pytest.raises(AnswerExpired):
        check(
            submit("approval", {"tool_call_id": "c", "decision": "approve"}), _waiting(seconds=-1), validate
        )
    two = {**_waiting(), **_waiting(call_id="d")}
    with pytest.raises(InvalidAnswer) as incomplete:
        check(submit("approval", {"tool_call_id": "c", "decision": "approve"}), two, validate)
    assert incomplete.value.details == {"missing": ["d"]}


async def test_a_repeat_is_a_replay_and_another_answer_a_conflict() -> None:
    waiting = _waiting("client")
    first = {"tool_call_id": "c", "output": "Paris"}
    answers, _ = check(Submission("client", [first]), waiting, RULES.validate)
    waiting["c"].answer = answers[0]
    assert check(Submission("client", [first]), waiting, RULES.validate)[1][0].replayed is True
    with pytest.raises(AnswerConflict):
        check(Submission("client", [{"tool_call_id": "c", "output": "Lyon"}]), waiting, RULES.validate)


async def test_a_closed_inbox_refuses_answers() -> None:
    inbox = Inbox()
    queued = inbox.submit("client", [{"tool_call_id": "c", "output": "x"}])
    inbox.close()
    with pytest.raises(NoPendingCall):
        await queued
    with pytest.raises(NoPendingCall):
        await inbox.submit("client", [])
