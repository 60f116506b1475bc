"""The agent loop (`app.turns.agent.AgentRun`) against a scripted model and small in-test tool registries."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.llm.types import FinishPart, ProviderError, ResolvedModel, TextPart, ToolCallPart, UsagePart
from app.tools.registry import ToolContext, ToolOutcome, ToolRegistry
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
from app.turns.agent_events import InputAnswered, InputRequested
from app.turns.pending_calls import Inbox
from tests.support.guarded_tools import guarded_registry
from tests.support.scripted import Response, ScriptedModel, ScriptItem, Sleep, text, tool_call

pytestmark = pytest.mark.anyio

MODEL = ResolvedModel(name="scripted/test", context_window=8192)
USER = {"role": "user", "content": "hi"}
# Long enough that a test relying on it would time out visibly, short enough to keep a failure cheap.
GUARD = 1.0


def basic_registry() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.register
    async def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    @registry.register
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    return registry


def make_run(
    adapter: ScriptedModel,
    *,
    tools: ToolRegistry | None = None,
    tool_names: list[str] | None = None,
    messages: list[dict[str, Any]] | None = None,
    **options: Any,
) -> AgentRun:
    registry = tools if tools is not None else basic_registry()
    return AgentRun(
        adapter=adapter,
        model=MODEL,
        tools=registry,
        tool_names=tool_names if tool_names is not None else registry.names(),
        messages=messages if messages is not None else [dict(USER)],
        session_id="ses_1",
        turn_id="turn_1",
        **options,
    )


async def drain(events: AsyncIterator[AgentEvent], into: list[AgentEvent]) -> None:
    """Consume every event into `into`, so a test can inspect them even when the run raises."""
    async for event in events:
        into.append(event)


async def collect(run: AgentRun) -> list[AgentEvent]:
    events: list[AgentEvent] = []
    await drain(run.run(), events)
    return events


def finished_responses(events: list[AgentEvent]) -> list[ResponseFinished]:
    return [e for e in events if isinstance(e, ResponseFinished)]


def tool_events(events: list[AgentEvent]) -> list[tuple[str, str]]:
    """("started" | "finished", tool name) for every tool event, in order."""
    out: list[tuple[str, str]] = []
    for e in events:
        if isinstance(e, ToolStarted):
            out.append(("started", e.call.name))
        elif isinstance(e, ToolFinished):
            out.append(("finished", e.call.name))
    return out


def assistant_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_result(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


# --- a plain text answer ---------------------------------------------------------------------------------


async def test_text_only_response_yields_events_in_order_and_records_the_assistant_message() -> None:
    usage = UsagePart(prompt_tokens=7, completion_tokens=2, total_tokens=9)
    adapter = ScriptedModel([[TextPart("Hel"), TextPart("lo"), usage, FinishPart("stop")]])
    messages: list[dict[str, Any]] = [dict(USER)]
    registry = basic_registry()
    run = make_run(adapter, tools=registry, tool_names=["echo"], messages=messages, provider_timeout=42.0)

    events = await collect(run)

    assert events[:3] == [ResponseStarted(), TextChunk("Hel"), TextChunk("lo")]
    assert len(events) == 4
    finished = events[3]
    assert isinstance(finished, ResponseFinished)
    assert finished.text == "Hello"
    assert finished.calls == []
    assert finished.finish_reason == "stop"
    assert finished.usage == usage
    assert isinstance(finished.duration_ms, int)
    assert finished.duration_ms >= 0
    assert messages == [USER, {"role": "assistant", "content": "Hello"}]

    [request] = adapter.requests
    assert request.model == MODEL
    assert list(request.messages) == [USER]
    assert list(request.tools) == registry.schemas(["echo"])
    assert request.timeout == 42.0
    [stream] = adapter.streams
    assert stream.completed
    assert stream.closed


async def test_finish_reason_keeps_the_last_non_empty_value_and_usage_the_last_part() -> None:
    first, last = UsagePart(1, 1, 2), UsagePart(5, 3, 8)
    adapter = ScriptedModel([[TextPart("x"), first, FinishPart("length"), FinishPart(None), last]])
    [finished] = finished_responses(await collect(make_run(adapter)))
    assert finished.finish_reason == "length"
    assert finished.usage == last


async def test_response_without_finish_or_usage_reports_none() -> None:
    adapter = ScriptedModel([text("ok")])
    [finished] = finished_responses(await collect(make_run(adapter)))
    assert (finished.text, finished.finish_reason, finished.usage) == ("ok", None, None)


async def test_duration_ms_measures_the_model_response() -> None:
    adapter = ScriptedModel([text("a", "b")], delay=0.02)
    [finished] = finished_responses(await collect(make_run(adapter)))
    assert 30 <= finished.duration_ms < 400


# --- tool calls --------------------------------------------------------------------------------------------


async def test_fragmented_interleaved_tool_calls_are_reassembled_run_and_fed_back_in_call_order() -> None:
    adapter = ScriptedModel(
        [
            [
                TextPart("Let me check."),
                ToolCallPart(1, "call_add", "add", '{"a": '),
                ToolCallPart(0, None, "echo", '{"te'),
                ToolCallPart(1, None, None, '2, "b"'),
                ToolCallPart(0, None, None, 'xt": "hi"}'),
                ToolCallPart(1, None, None, ": 3}"),
                FinishPart("tool_calls"),
            ],
            [TextPart("All done."), FinishPart("stop")],
        ]
    )
    messages: list[dict[str, Any]] = [dict(USER)]
    events = await collect(make_run(adapter, messages=messages))

    first, second = finished_responses(events)
    echo_call, add_call = first.calls
    assert re.fullmatch(r"call_[0-9a-f]{16}", echo_call.id), echo_call.id
    assert (echo_call.name, echo_call.arguments_text) == ("echo", '{"text": "hi"}')
    assert add_call == CallRequest("call_add", "add", '{"a": 2, "b": 3}')
    assert first.text == "Let me check."
    assert first.finish_reason == "tool_calls"

    assert [type(e) for e in events] == [
        ResponseStarted, TextChunk, ResponseFinished,
        ToolStarted, ToolStarted, ToolFinished, ToolFinished,
        ResponseStarted, TextChunk, ResponseFinished,
    ]  # fmt: skip
    started = [e.call for e in events if isinstance(e, ToolStarted)]
    assert started == [echo_call, add_call]
    results = {e.call.id: e for e in events if isinstance(e, ToolFinished)}
    assert results[echo_call.id].outcome == ToolOutcome("hi", is_error=False)
    assert results[add_call.id].outcome == ToolOutcome("5", is_error=False)
    assert all(e.duration_ms >= 0 for e in results.values())
    assert second.text == "All done."
    assert second.calls == []

    assistant = {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            assistant_call(echo_call.id, "echo", '{"text": "hi"}'),
            assistant_call("call_add", "add", '{"a": 2, "b": 3}'),
        ],
    }
    fed_back = [USER, assistant, tool_result(echo_call.id, "hi"), tool_result("call_add", "5")]
    assert len(adapter.requests) == 2
    assert list(adapter.requests[1].messages) == fed_back
    assert messages == [*fed_back, {"role": "assistant", "content": "All done."}]


async def test_assistant_message_without_text_has_null_content() -> None:
    adapter = ScriptedModel([[tool_call(0, "echo", '{"text": "x"}')], text("done")])
    messages: list[dict[str, Any]] = [dict(USER)]
    await collect(make_run(adapter, messages=messages))
    assert messages[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [assistant_call("call_0", "echo", '{"text": "x"}')],
    }


async def test_each_missing_id_gets_its_own_generated_id() -> None:
    adapter = ScriptedModel(
        [[ToolCallPart(0, None, "echo", '{"text": "a"}'), ToolCallPart(1, None, "echo", '{"text": "b"}')],
         text("done")]
    )  # fmt: skip
    [first, _] = finished_responses(await collect(make_run(adapter)))
    ids = [call.id for call in first.calls]
    assert all(re.fullmatch(r"call_[0-9a-f]{16}", i) for i in ids), ids
    assert len(set(ids)) == 2


async def test_tools_receive_their_context() -> None:
    registry = ToolRegistry()
    seen: list[ToolContext] = []

    @registry.register
    async def whoami(ctx: ToolContext) -> str:
        seen.append(ctx)
        return "ok"

    adapter = ScriptedModel([[tool_call(0, "whoami", "", id="call_w")], text("done")])
    await collect(make_run(adapter, tools=registry))
    assert seen == [ToolContext(session_id="ses_1", turn_id="turn_1", tool_call_id="call_w")]


async def test_tools_run_concurrently_finish_in_completion_order_and_enter_history_in_call_order() -> None:
    registry = ToolRegistry()
    b_ran = asyncio.Event()

    @registry.register
    async def wait_for_b() -> str:
        # Run one after the other, this would wait for a tool that only starts once it returns.
        await asyncio.wait_for(b_ran.wait(), GUARD)
        return "a done"

    @registry.register
    async def set_b() -> str:
        b_ran.set()
        return "b done"

    adapter = ScriptedModel([[tool_call(0, "wait_for_b", "{}"), tool_call(1, "set_b", "{}")], text("done")])
    messages: list[dict[str, Any]] = [dict(USER)]
    started = time.monotonic()
    events = await collect(make_run(adapter, tools=registry, messages=messages))
    elapsed = time.monotonic() - started

    assert tool_events(events) == [
        ("started", "wait_for_b"), ("started", "set_b"), ("finished", "set_b"), ("finished", "wait_for_b"),
    ]  # fmt: skip
    outcomes = [e.outcome for e in events if isinstance(e, ToolFinished)]
    assert outcomes == [ToolOutcome("b done", is_error=False), ToolOutcome("a done", is_error=False)]
    assert list(adapter.requests[1].messages)[2:] == [
        tool_result("call_0", "a done"),
        tool_result("call_1", "b done"),
    ]
    assert elapsed < GUARD / 2


async def test_tool_results_are_fed_back_even_when_they_are_errors() -> None:
    registry = ToolRegistry()

    @registry.register
    async def boom() -> str:
        raise RuntimeError("kaput")

    adapter = ScriptedModel([[tool_call(0, "boom", "{}")], text("sorry")])
    events = await collect(make_run(adapter, tools=registry))
    [finished] = [e for e in events if isinstance(e, ToolFinished)]
    assert finished.outcome == ToolOutcome("Tool 'boom' failed: RuntimeError: kaput", is_error=True)
    assert list(adapter.requests[1].messages)[2] == tool_result("call_0", finished.outcome.content)


async def test_unknown_or_not_allowed_tools_finish_with_an_error_and_the_loop_continues() -> None:
    registry = basic_registry()  # holds echo and add; the session only allows echo
    adapter = ScriptedModel(
        [
            [
                tool_call(0, "nope", "{}"),
                tool_call(1, "add", '{"a": 1, "b": 2}'),
                tool_call(2, "echo", '{"text": "fine"}'),
            ],
            text("recovered"),
        ]
    )
    events = await collect(make_run(adapter, tools=registry, tool_names=["echo"]))

    outcomes = {e.call.name: e.outcome for e in events if isinstance(e, ToolFinished)}
    assert outcomes == {
        "nope": ToolOutcome("Unknown tool 'nope'. Available tools: echo", is_error=True),
        "add": ToolOutcome("Unknown tool 'add'. Available tools: echo", is_error=True),
        "echo": ToolOutcome("fine", is_error=False),
    }
    assert list(adapter.requests[1].tools) == registry.schemas(["echo"])
    assert [m["role"] for m in adapter.requests[1].messages] == ["user", "assistant", "tool", "tool", "tool"]
    assert finished_responses(events)[-1].text == "recovered"


async def test_arguments_that_are_not_a_json_object_are_repeated_raw_and_reported_to_the_model() -> None:
    adapter = ScriptedModel(
        [[tool_call(0, "echo", "{not json"), tool_call(1, "echo", '"abc"')], text("done")]
    )
    messages: list[dict[str, Any]] = [dict(USER)]
    events = await collect(make_run(adapter, messages=messages))

    assert messages[1]["tool_calls"] == [
        assistant_call("call_0", "echo", "{not json"),
        assistant_call("call_1", "echo", '"abc"'),
    ]
    outcomes = {e.call.id: e.outcome for e in events if isinstance(e, ToolFinished)}
    assert outcomes["call_0"].is_error
    assert "not valid JSON" in outcomes["call_0"].content
    assert outcomes["call_1"] == ToolOutcome(
        "Arguments for tool 'echo' must be a JSON object, got string instead", is_error=True
    )


# --- provider errors and retries ---------------------------------------------------------------------------


def retryable(code: str = "rate_limited") -> ProviderError:
    return ProviderError(code, "Try again.", status=429, retryable=True)


async def test_retryable_errors_before_any_text_are_retried_and_the_run_succeeds() -> None:
    adapter = ScriptedModel(
        [
            retryable(),
            # A tool-call fragment is not shown to the user: failing after it may still be retried.
            [ToolCallPart(0, "call_lost", "echo", '{"te'), retryable("overloaded")],
            [TextPart("Hello"), FinishPart("stop")],
        ]
    )
    messages: list[dict[str, Any]] = [dict(USER)]
    events = await collect(make_run(adapter, messages=messages, retries=2, retry_backoff=0))

    assert [type(e) for e in events] == [ResponseStarted, TextChunk, ResponseFinished]
    [finished] = finished_responses(events)
    assert (finished.text, finished.calls, finished.finish_reason) == ("Hello", [], "stop")
    assert len(adapter.requests) == 3
    assert all(list(r.messages) == [USER] for r in adapter.requests)
    assert adapter.closed == [True, True, True]
    assert messages == [USER, {"role": "assistant", "content": "Hello"}]


@pytest.mark.parametrize("retries", [0, 1, 2])
async def test_retryable_error_propagates_once_retries_are_exhausted(retries: int) -> None:
    errors = [retryable(f"attempt_{i}") for i in range(retries + 1)]
    script: list[Response] = [*errors, text("too late")]
    adapter = ScriptedModel(script)
    events: list[AgentEvent] = []

    with pytest.raises(ProviderError) as info:
        await drain(make_run(adapter, retries=retries, retry_backoff=0).run(), events)

    assert info.value is errors[-1]
    assert len(adapter.requests) == retries + 1
    assert events == [ResponseStarted()]


async def test_retries_back_off_exponentially() -> None:
    adapter = ScriptedModel([retryable(), retryable(), text("ok")])
    started = time.monotonic()
    await collect(make_run(adapter, retries=2, retry_backoff=0.03))
    # 0.03 s, then 0.06 s.
    assert 0.085 <= time.monotonic() - started < 0.4


async def test_non_retryable_error_propagates_immediately() -> None:
    error = ProviderError("auth_failed", "Bad key.", status=401, retryable=False)
    adapter = ScriptedModel([error, text("never")])
    messages: list[dict[str, Any]] = [dict(USER)]

    with pytest.raises(ProviderError) as info:
        await collect(make_run(adapter, messages=messages, retries=2, retry_backoff=0))

    assert info.value is error
    assert len(adapter.requests) == 1
    assert messages == [USER]


async def test_retryable_error_after_streamed_text_is_not_retried() -> None:
    error = retryable()
    adapter = ScriptedModel([[TextPart("Hel"), error], text("Hello")])
    messages: list[dict[str, Any]] = [dict(USER)]
    events: list[AgentEvent] = []

    with pytest.raises(ProviderError) as info:
        await drain(make_run(adapter, messages=messages, retries=2, retry_backoff=0).run(), events)

    assert info.value is error
    assert len(adapter.requests) == 1
    assert events == [ResponseStarted(), TextChunk("Hel")]
    assert messages == [USER]
    assert adapter.closed == [True]


# --- bounds and breakpoints --------------------------------------------------------------------------------


async def test_a_model_that_always_calls_tools_stops_after_max_rounds() -> None:
    always_calls: list[ScriptItem] = [tool_call(0, "echo", '{"text": "again"}'), FinishPart("tool_calls")]
    adapter = ScriptedModel([always_calls] * 4)
    messages: list[dict[str, Any]] = [dict(USER)]
    events: list[AgentEvent] = []

    with pytest.raises(AgentError) as info:
        await drain(make_run(adapter, messages=messages, max_rounds=3).run(), events)

    assert info.value.code == "max_tool_rounds"
    assert len(adapter.requests) == 3
    assert [len(r.messages) for r in adapter.requests] == [1, 3, 5]
    assert sum(isinstance(e, ToolFinished) for e in events) == 3
    assert [m["role"] for m in messages] == ["user"] + ["assistant", "tool"] * 3


async def test_max_rounds_allows_a_final_answer_in_the_last_round() -> None:
    call = [tool_call(0, "echo", '{"text": "x"}')]
    adapter = ScriptedModel([call, call, text("finally")])
    events = await collect(make_run(adapter, max_rounds=3))
    assert finished_responses(events)[-1].text == "finally"
    assert len(adapter.requests) == 3


async def test_should_pause_after_a_tool_round_yields_a_breakpoint_and_stops() -> None:
    adapter = ScriptedModel([[tool_call(0, "echo", '{"text": "x"}')], text("never")])
    messages: list[dict[str, Any]] = [dict(USER)]
    events = await collect(make_run(adapter, messages=messages, should_pause=lambda: True))

    assert [type(e) for e in events] == [
        ResponseStarted, ResponseFinished, ToolStarted, ToolFinished, BreakpointReached,
    ]  # fmt: skip
    assert len(adapter.requests) == 1
    # The tool results are committed to the history before the turn ends.
    assert messages[-1] == tool_result("call_0", "x")


async def test_should_pause_false_lets_the_loop_continue() -> None:
    checks: list[int] = []

    def should_pause() -> bool:
        checks.append(len(checks))
        return False

    adapter = ScriptedModel(
        [[tool_call(0, "echo", '{"text": "x"}')], [tool_call(0, "echo", '{"text": "y"}')], text("done")]
    )
    events = await collect(make_run(adapter, should_pause=should_pause))

    assert not any(isinstance(e, BreakpointReached) for e in events)
    assert len(adapter.requests) == 3
    assert finished_responses(events)[-1].text == "done"
    assert len(checks) == 2  # asked after each tool round, not after the final answer


async def test_should_pause_is_not_consulted_for_a_final_answer() -> None:
    adapter = ScriptedModel([text("just text")])
    events = await collect(make_run(adapter, should_pause=lambda: True))
    assert [type(e) for e in events] == [ResponseStarted, TextChunk, ResponseFinished]


async def test_should_pause_can_stop_a_later_round() -> None:
    rounds: list[None] = []

    def pause_on_second() -> bool:
        rounds.append(None)
        return len(rounds) >= 2

    call = [tool_call(0, "echo", '{"text": "x"}')]
    adapter = ScriptedModel([call, call, text("never")])
    events = await collect(make_run(adapter, should_pause=pause_on_second))
    assert isinstance(events[-1], BreakpointReached)
    assert len(adapter.requests) == 2


# --- cancellation and closing ------------------------------------------------------------------------------


def hanging_tool(registry: ToolRegistry) -> tuple[asyncio.Event, asyncio.Event]:
    """Register `hang`, which waits forever; returns (entered, saw_cancel) events."""
    entered, saw_cancel = asyncio.Event(), asyncio.Event()

    @registry.register
    async def hang() -> str:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            saw_cancel.set()
            raise
        return "never"

    return entered, saw_cancel


async def wait_for(event: asyncio.Event) -> None:
    await asyncio.wait_for(event.wait(), GUARD)


@pytest.mark.parametrize(
    ("script", "delay", "received"),
    [
        pytest.param(text("a", "b"), 60.0, [ResponseStarted()], id="per-part-delay"),
        pytest.param(
            [TextPart("a"), Sleep(math.inf), TextPart("b")],
            0.0,
            [ResponseStarted(), TextChunk("a")],
            id="mid-stream",
        ),
    ],
)
async def test_cancelling_the_consumer_while_the_model_streams_closes_the_stream(
    script: Response, delay: float, received: list[AgentEvent]
) -> None:
    adapter = ScriptedModel([script], delay=delay)
    messages: list[dict[str, Any]] = [dict(USER)]
    events: list[AgentEvent] = []
    task = asyncio.create_task(drain(make_run(adapter, messages=messages).run(), events))
    await wait_for(adapter.sleeping)

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    [stream] = adapter.streams
    assert stream.cancelled
    assert stream.closed
    assert not stream.completed
    assert events == received
    assert messages == [USER]


async def test_cancelling_the_consumer_while_tools_run_cancels_them() -> None:
    registry = basic_registry()
    entered, saw_cancel = hanging_tool(registry)
    adapter = ScriptedModel([[tool_call(0, "hang", "{}")], text("never")])
    messages: list[dict[str, Any]] = [dict(USER)]
    events: list[AgentEvent] = []
    task = asyncio.create_task(drain(make_run(adapter, tools=registry, messages=messages).run(), events))
    await wait_for(entered)

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0)  # one loop pass for the cancelled tool task to run its handler

    assert saw_cancel.is_set()
    assert tool_events(events) == [("started", "hang")]
    assert len(adapter.requests) == 1
    assert [m["role"] for m in messages] == ["user", "assistant"]  # no result for the interrupted call


async def test_aclose_before_the_model_is_called_makes_no_request() -> None:
    adapter = ScriptedModel([text("never")])
    events = make_run(adapter).run()
    assert await anext(events) == ResponseStarted()
    await events.aclose()
    assert adapter.requests == []


async def test_aclose_while_suspended_at_a_text_chunk_closes_the_model_stream() -> None:
    adapter = ScriptedModel([text("a", "b")])
    events = make_run(adapter).run()
    assert await anext(events) == ResponseStarted()
    assert await anext(events) == TextChunk("a")

    await events.aclose()

    assert adapter.closed == [True]


@pytest.mark.parametrize("stop_at", [ToolStarted, ToolFinished])
async def test_aclose_while_suspended_at_a_tool_event_cancels_running_tools(
    stop_at: type[ToolStarted] | type[ToolFinished],
) -> None:
    registry = basic_registry()
    entered, saw_cancel = hanging_tool(registry)
    adapter = ScriptedModel([[tool_call(0, "hang", "{}"), tool_call(1, "echo", '{"text": "x"}')]])
    events = make_run(adapter, tools=registry).run()
    async for event in events:
        if isinstance(event, stop_at) and event.call.name == "echo":
            break
    # The consumer is busy elsewhere (as the recorder writing to the database) while `hang` runs.
    await wait_for(entered)

    await events.aclose()
    await asyncio.sleep(0)  # one loop pass for the cancelled tool task to run its handler

    assert saw_cancel.is_set()


# --- CallRequest.arguments ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"a": 1, "b": [true, null]}', {"a": 1, "b": [True, None]}),
        ('  {"nested": {"x": "y"}}\n', {"nested": {"x": "y"}}),
        ("{}", {}),
        ("", {}),
        ("   \n", {}),
        ("{not json", "{not json"),
        ('{"a": 1', '{"a": 1'),
        ('"abc"', '"abc"'),
        ("[1]", "[1]"),
        ("42", "42"),
        ("null", "null"),
        ("true", "true"),
    ],
)
def test_call_request_arguments(raw: str, expected: Any) -> None:
    assert CallRequest("call_1", "echo", raw).arguments == expected


def test_call_request_arguments_deeply_nested_json_falls_back_to_raw_text() -> None:
    raw = "[" * 100_000 + "]" * 100_000
    assert CallRequest("call_1", "echo", raw).arguments == raw


def test_arguments_round_trip_as_written_for_objects() -> None:
    raw = '{"text": "héllo"}'
    assert json.dumps(CallRequest("c", "echo", raw).arguments, ensure_ascii=False) == raw


@pytest.mark.parametrize("selection", [["shop__slow"], ["shop"], ["shop/*"]])
async def test_a_run_built_without_wait_rules_still_waits_for_a_tool_the_tools_file_guards(
    selection: list[str],
) -> None:
    """However a run is built (a protocol adapter, a regenerated branch: no WaitRules given), the tools
    file's rule is the registry's, decided from the tool the call resolves to: the call waits for a
    person and runs only once approved."""
    registry, provider = guarded_registry()
    adapter = ScriptedModel([[tool_call(0, "shop__slow", "{}", id="call_g")], text("done")])
    inbox = Inbox()
    run = make_run(adapter, tools=registry, tool_names=selection, inbox=inbox)
    events: list[AgentEvent] = []
    answered: asyncio.Future[Any] | None = None
    async for event in run.run():
        events.append(event)
        if isinstance(event, InputRequested):
            assert provider.ran == []  # nothing ran before the approval
            answered = inbox.submit("approval", [{"tool_call_id": "call_g", "decision": "approve"}])
        if isinstance(event, InputAnswered) and event.submission is not None:
            event.submission.future.set_result(event.replies)  # the recorder's part
    assert answered is not None and [r.resolution for r in await answered] == ["approve"]
    [started] = [e for e in events if isinstance(e, ToolStarted)]
    assert started.waits_for == "approval"
    assert provider.ran == ["shop__slow"]
    [finished] = [e for e in events if isinstance(e, ToolFinished)]
    assert finished.outcome == ToolOutcome("shop__slow ran", is_error=False)
