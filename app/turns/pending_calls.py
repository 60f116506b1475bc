"""Calls that wait outside the service: a client tool's result, or a person's decision (approval).

Pure state, no storage: the agent loop (turns.rounds) keeps one `Waiting` per such call of the current tool
round, and reads answers from the turn's `Inbox`, which requests (through the runner) put them in. An
answer is checked here against what waits (`no_pending_call` for a call that does not wait, `expired` after
expiry, `invalid_answer` for edited arguments the tool refuses or a set of decisions that leaves one out),
then handed to the recorder,
which commits it before the answering request gets its reply: an acknowledged answer is never lost.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from app.errors import DomainError
from app.protocol.tool_requests import Resolution
from app.tools.registry import ToolOutcome

Kind = Literal["client", "approval"]
DECISIONS = ["approve", "edit", "reject"]
APPROVAL_TIMED_OUT = "approval timed out"


class AnswerRefused(DomainError):
    """An answer refused as a whole (nothing of it is taken): a family, raise one of its kinds."""


class NoPendingCall(AnswerRefused):
    code = "no_pending_call"


class AnswerConflict(AnswerRefused):
    code = "answer_conflict"


class AnswerExpired(AnswerRefused):
    code = "expired"


class InvalidAnswer(AnswerRefused):
    code = "invalid_answer"


@dataclass(frozen=True, slots=True)
class Answer:
    """How one waiting call was resolved. `outcome` is what the model reads, when known without running
    the tool (a client's result, a reject, an expiry); an approved call's comes from running it."""

    call_id: str
    resolution: Literal["answered", "approve", "edit", "reject", "expired", "interrupted"]
    given: dict[str, Any] | None
    outcome: ToolOutcome | None
    wait_ms: int
    arguments_text: str | None = None
    reason: str | None = None


@dataclass
class Waiting:
    call_id: str
    name: str
    arguments: Any
    kind: Kind
    requested_at: str
    expires_at: str
    answer: Answer | None = None

    @property
    def deadline(self) -> float:
        return datetime.fromisoformat(self.expires_at).timestamp()

    def waited_ms(self) -> int:
        return max(0, round((time.time() - datetime.fromisoformat(self.requested_at).timestamp()) * 1000))


@dataclass
class Submission:
    kind: Kind
    items: list[dict[str, Any]]
    future: asyncio.Future[list[Resolution]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Inbox:
    """A turn's answers on their way to its agent loop. It takes them while a round may read them: from
    the turn's start, and from the announcement of a round's waiting calls until their last answer is
    committed (`shut`, and `open` again at the next round's announcement). An answer it does not take is
    refused at once (409 no_pending_call), whatever waits in it then too: nothing would read it, and the
    request answers from the committed rows instead (tool_answers: a replay, or the conflict). Closed
    when the turn ends."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Submission] = asyncio.Queue()
        self._taking = True
        self.closed = False

    def submit(self, kind: Kind, items: list[dict[str, Any]]) -> asyncio.Future[list[Resolution]]:
        submission = Submission(kind, items)
        if self.closed:
            submission.future.set_exception(_turn_ended())
        elif not self._taking:
            submission.future.set_exception(_answered())
        else:
            self._queue.put_nowait(submission)
        return submission.future

    async def get(self) -> Submission:
        return await self._queue.get()

    def open(self) -> None:
        """A round announces calls that wait: answers are taken again."""
        self._taking = not self.closed

    def shut(self) -> None:
        """Every call of the round has its answer committed: what comes now, or still waits here, is
        answered from the rows."""
        self._taking = False
        self._refuse(_answered)

    def close(self) -> None:
        self.closed = True
        self._taking = False
        self._refuse(_turn_ended)

    def _refuse(self, refusal: Callable[[], AnswerRefused]) -> None:
        while not self._queue.empty():
            future = self._queue.get_nowait().future
            if not future.done():
                future.set_exception(refusal())


def _turn_ended() -> AnswerRefused:
    return NoPendingCall("The turn no longer waits for this answer (it ended).")


def _answered() -> AnswerRefused:
    return NoPendingCall("No call of the turn waits for an answer now.")


def expiry(seconds: float) -> tuple[str, str]:
    """Now and `seconds` from now, as stored and sent (UTC ISO 8601 with offset)."""
    now = datetime.now(UTC)
    until = datetime.fromtimestamp(now.timestamp() + seconds, UTC)
    return now.isoformat(timespec="milliseconds"), until.isoformat(timespec="milliseconds")


def client_outcome(item: dict[str, Any]) -> ToolOutcome:
    if item.get("error") is not None:
        return ToolOutcome(str(item["error"]), is_error=True)
    output = item.get("output")
    text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
    return ToolOutcome(text, is_error=False)


def rejected(reason: str | None) -> ToolOutcome:
    return ToolOutcome(
        f"The user rejected this tool call: {reason}" if reason else "The user rejected this tool call.",
        is_error=True,
    )


def expired_outcome(waiting: Waiting, seconds: float) -> ToolOutcome:
    if waiting.kind == "approval":
        return ToolOutcome(APPROVAL_TIMED_OUT, is_error=True)
    return ToolOutcome(
        f"Tool '{waiting.name}' timed out: the client returned no result within {seconds:g} s.", is_error=True
    )


# Validates edited arguments for a tool: None when they are valid, else what is wrong.
ArgumentCheck = Callable[[str, dict[str, Any]], str | None]


def check(
    submission: Submission, waiting: dict[str, Waiting], validate: ArgumentCheck
) -> tuple[list[Answer], list[Resolution]]:
    """The new answers of a submission, and the reply for every item (repeats included). Raises the
    AnswerRefused the request gets when any item is refused: then nothing of it is taken."""
    items = submission.items
    ids = [item["tool_call_id"] for item in items]
    if len(set(ids)) != len(ids):
        raise InvalidAnswer("A tool call is answered twice in one request.", details={"tool_call_ids": ids})
    answers: list[Answer] = []
    replies: list[Resolution] = []
    for item in items:
        found = waiting.get(item["tool_call_id"])
        if found is None or found.kind != submission.kind:
            raise NoPendingCall(
                f"No {_noun(submission.kind)} waits for tool call {item['tool_call_id']!r}.",
                details={"tool_call_id": item["tool_call_id"]},
            )
        if found.answer is not None:
            replies.append(_repeat(found, item))
            continue
        if found.deadline <= time.time():  # its expiry is being recorded right now
            raise AnswerExpired(
                f"The wait for tool call {found.call_id!r} expired.", details={"tool_call_id": found.call_id}
            )
        answer = _answer(submission.kind, found, item, validate)
        answers.append(answer)
        replies.append(Resolution(tool_call_id=found.call_id, resolution=answer.resolution, replayed=False))
    if submission.kind == "approval" and answers:
        _covers_round(ids, waiting)
    return answers, replies


def _noun(kind: Kind) -> str:
    return "client tool call" if kind == "client" else "approval request"


def _repeat(found: Waiting, item: dict[str, Any]) -> Resolution:
    assert found.answer is not None
    if found.answer.resolution == "expired":
        raise AnswerExpired(
            f"The wait for tool call {found.call_id!r} expired; the model has read a timeout error.",
            details={"tool_call_id": found.call_id},
        )
    if found.answer.given != item:
        raise AnswerConflict(
            f"Tool call {found.call_id!r} was answered differently before.",
            details={"tool_call_id": found.call_id, "answer": found.answer.given},
        )
    return Resolution(tool_call_id=found.call_id, resolution=found.answer.resolution, replayed=True)


def _covers_round(ids: Sequence[str], waiting: dict[str, Waiting]) -> None:
    missing = [
        w.call_id
        for w in waiting.values()
        if w.kind == "approval" and w.answer is None and w.call_id not in ids
    ]
    if missing:
        raise InvalidAnswer(
            "One answer must decide every open approval request of the round.", details={"missing": missing}
        )


def _answer(kind: Kind, found: Waiting, item: dict[str, Any], validate: ArgumentCheck) -> Answer:
    wait_ms = found.waited_ms()
    if kind == "client":
        return Answer(found.call_id, "answered", item, client_outcome(item), wait_ms)
    decision = item["decision"]
    reason = item.get("reason")
    if decision == "reject":
        return Answer(found.call_id, "reject", item, rejected(reason), wait_ms, reason=reason)
    arguments_text = None
    if decision == "edit":
        problem = validate(found.name, item["arguments"])
        if problem is not None:
            raise InvalidAnswer(
                f"The edited arguments do not fit tool {found.name!r}: {problem}",
                details={"tool_call_id": found.call_id, "problem": problem},
            )
        arguments_text = json.dumps(item["arguments"], ensure_ascii=False)
    return Answer(found.call_id, decision, item, None, wait_ms, arguments_text=arguments_text, reason=reason)
