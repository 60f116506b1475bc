"""app.turns.context.compactor: a turn's compaction over a scripted summariser; and the agent loop with it
(app.turns.agent): the view sent, the event before the call, a refused call compacted harder and retried
once, the summary abandoned whole when a stop cancels its model call."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from app.llm.types import ProviderError, ResolvedModel, UsagePart
from app.settings import Settings
from app.tools.registry import build_default_registry
from app.turns.agent import AgentRun, ResponseFinished
from app.turns.context.compactor import (
    FIRST_SCALE,
    Compactor,
    ContextCompacted,
    SummaryModel,
    resolve_policy,
)
from app.turns.context.planner import Policy, View
from tests.fakes.strict import validate_history
from tests.support.scripted import ScriptedModel, Sleep, text

pytestmark = pytest.mark.anyio

MODEL = ResolvedModel("scripted", context_window=2000)


def _history(turns: int) -> tuple[list[dict[str, Any]], list[tuple[str, ...]]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    owners: list[tuple[str, ...]] = [()]
    for n in range(turns):
        messages += [
            {"role": "user", "content": f"question {n} " + "word " * 150},
            {"role": "assistant", "content": f"answer {n} " + "word " * 100},
        ]
        owners += [(f"t_{n}",), (f"t_{n}",)]
    messages.append({"role": "user", "content": "the running turn's question"})
    owners.append(("t_run",))
    return messages, owners


def _compactor(summariser: ScriptedModel, turns: list[tuple[str, ...]], keep: int = 2) -> Compactor:
    return Compactor(
        Policy("auto", keep, 200), MODEL.context_window, turns, SummaryModel(summariser, MODEL), scale=1.0
    )


async def _views(compactor: Compactor, messages: list[dict[str, Any]], **kw: Any) -> list[Any]:
    return [item async for item in compactor.view(messages, **kw)]


async def test_a_summary_is_written_once_and_announced_before_the_view() -> None:
    messages, turns = _history(12)
    summariser = ScriptedModel([text("- nine questions")])
    compactor = _compactor(summariser, turns)
    event, view = await _views(compactor, messages)
    assert isinstance(event, ContextCompacted) and isinstance(view, View)
    assert event.written and event.summary is not None and event.summary.content == "- nine questions"
    assert event.tokens_after == view.tokens < event.tokens_before
    assert view.fits and validate_history(view.messages) == []
    assert "- nine questions" in view.messages[0]["content"]
    # The summariser read the folded turns, oldest first, not the kept ones.
    [request] = summariser.requests
    assert "question 0" in request.messages[1]["content"]
    assert "question 11" not in request.messages[1]["content"]
    # The next call of the turn sends the same view: nothing new to announce, no new summary.
    assert await _views(compactor, messages) == [view]
    assert len(summariser.requests) == 1


async def test_a_stop_during_the_summary_keeps_nothing_of_it() -> None:
    messages, turns = _history(12)
    summariser = ScriptedModel([[Sleep(math.inf), *text("never")]])
    compactor = _compactor(summariser, turns)
    task = asyncio.create_task(_views(compactor, messages))
    await summariser.sleeping.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert compactor.summary is None
    assert summariser.streams[0].closed


async def test_calibration_follows_the_providers_count() -> None:
    messages, turns = _history(1)
    compactor = _compactor(ScriptedModel([]), turns)
    [view] = await _views(compactor, messages)
    assert compactor.sent_estimate is not None and view.messages == messages
    assert compactor.calibrate(compactor.sent_estimate * 2) == 2.0
    # Within 2% of the scale in force: kept, nothing to store.
    assert compactor.calibrate(compactor.sent_estimate * 2 + 1) is None and compactor.scale == 2.0
    assert compactor.calibrate(0) is None


def test_the_policy_is_what_the_session_stored_over_the_settings_defaults() -> None:
    settings = Settings(context_strategy="off", context_keep_turns=7, context_reserve_tokens=9)
    assert resolve_policy(None, settings) == Policy("off", 7, 9)
    assert resolve_policy({"strategy": "auto", "reserve_tokens": 0}, settings) == Policy("auto", 7, 0)
    assert FIRST_SCALE > 1


async def test_the_agent_sends_the_view_and_retries_a_refused_call_once_compacted_harder() -> None:
    messages, turns = _history(4)
    sent = len(messages)
    refused = ProviderError("context_window_exceeded", "too long", status=400)
    usage = UsagePart(prompt_tokens=900, completion_tokens=3, total_tokens=903)
    model = ScriptedModel([refused, [*text("fine"), usage]])
    summariser = ScriptedModel([text("- earlier")])
    agent = AgentRun(
        adapter=model,
        model=MODEL,
        tools=build_default_registry(),
        tool_names=[],
        messages=messages,
        session_id="s_1",
        turn_id="t_run",
        compactor=_compactor(summariser, turns, keep=4),
    )
    events = [event async for event in agent.run()]
    compacted = [e for e in events if isinstance(e, ContextCompacted)]
    # The whole history fit the estimate; refused, the retry folded the older turns (keep 1).
    assert len(compacted) == 1 and compacted[0].written
    first, second = model.requests
    assert first.messages == messages[: len(first.messages)]
    assert len(second.messages) < len(first.messages) and validate_history(list(second.messages)) == []
    finished = [e for e in events if isinstance(e, ResponseFinished)]
    assert finished[-1].text == "fine" and finished[-1].context_scale is not None
    # The history the agent keeps is whole, with the answer after it.
    assert agent.messages[-1] == {"role": "assistant", "content": "fine"}
    assert len(agent.messages) == sent + 1


async def test_a_second_refusal_fails_the_turn_as_before() -> None:
    messages, turns = _history(2)
    refused = ProviderError("context_window_exceeded", "too long", status=400)
    agent = AgentRun(
        adapter=ScriptedModel([refused, refused]),
        model=MODEL,
        tools=build_default_registry(),
        tool_names=[],
        messages=messages,
        session_id="s_1",
        turn_id="t_run",
        compactor=_compactor(ScriptedModel([text("- s")] * 2), turns),
    )
    with pytest.raises(ProviderError) as failed:
        _ = [event async for event in agent.run()]
    assert failed.value.code == "context_window_exceeded"
