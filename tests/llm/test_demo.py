"""The demo model: its replies through `DemoAdapter`, in-process (it never goes through LiteLLM).

No network, no API key. The reply tests drive the adapter the service uses.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import pytest

from app.llm.demo import DEMO_CONTEXT_WINDOW, DEMO_MODEL, DemoAdapter, sleep_until
from app.llm.types import (
    FinishPart,
    ModelRequest,
    ReasoningPart,
    ResolvedModel,
    StreamPart,
    TextPart,
    ToolCallPart,
    UsagePart,
)

# litellm installs these "ignore" filters at import, but pytest's filterwarnings=error replaces the filter
# list for each test, so pydantic's lazy schema build inside litellm would fail the first call.
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*`ReadOnly` qualifier"),
    pytest.mark.filterwarnings("ignore:.*conflict with protected namespace"),
    pytest.mark.filterwarnings("ignore:.*Accessing the.*attribute on the instance is deprecated"),
    pytest.mark.filterwarnings("ignore:Pydantic serializer warnings"),
]

Message = dict[str, object]


def _tool(name: str) -> dict[str, object]:
    params = {"type": "object", "properties": {"x": {"type": "string"}}}
    return {
        "type": "function",
        "function": {"name": name, "description": f"The {name} tool.", "parameters": params},
    }


TOOLS = [_tool("current_time"), _tool("calculate")]


@dataclass
class Reply:
    text: str = ""
    calls: dict[int, list[str]] = field(default_factory=dict)  # index -> [id, name, arguments]
    fragments: int = 0
    finish: str | None = None
    usage: tuple[int, int, int] | None = None
    usage_last: bool = False  # the usage came last, after everything else
    reasoning: str = ""


def _request(messages: list[Message], tools: list[dict[str, object]] | None) -> ModelRequest:
    return ModelRequest(ResolvedModel(DEMO_MODEL, DEMO_CONTEXT_WINDOW), messages, tools or [], 30.0)


def _collect(parts: list[StreamPart]) -> Reply:
    reply = Reply()
    for part in parts:
        reply.usage_last = isinstance(part, UsagePart)
        if isinstance(part, TextPart):
            reply.text += part.text
        elif isinstance(part, ToolCallPart):
            reply.fragments += 1
            entry = reply.calls.setdefault(part.index, [part.id or "", part.name or "", ""])
            entry[2] += part.arguments
        elif isinstance(part, FinishPart):
            reply.finish = part.reason
        elif isinstance(part, ReasoningPart):
            reply.reasoning += part.text
        else:
            reply.usage = (part.prompt_tokens, part.completion_tokens, part.total_tokens)
    return reply


async def _parts(
    adapter: DemoAdapter, messages: list[Message], tools: list[dict[str, object]] | None
) -> list[StreamPart]:
    return [part async for part in adapter.stream(_request(messages, tools))]


def run(messages: list[Message], tools: list[dict[str, object]] | None = TOOLS) -> Reply:
    return _collect(asyncio.run(_parts(DemoAdapter(token_delay=0), messages, tools)))


def user(text: str) -> list[Message]:
    return [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": text}]


def test_plain_reply_is_deterministic_with_usage() -> None:
    first = run(user("Tell me something nice about Tuesdays."))
    second = run(user("Tell me something nice about Tuesdays."))
    assert first == second
    assert first.text.startswith("You said: Tell me something nice about Tuesdays.")
    assert 30 <= len(first.text.split()) <= 60
    assert first.finish == "stop"
    assert first.calls == {}
    assert first.usage_last
    assert first.usage is not None
    prompt, completion, total = first.usage
    assert prompt >= 1
    assert completion == len(first.text.split())  # one streamed token per word
    assert total == prompt + completion


def test_time_question_streams_fragmented_tool_call() -> None:
    reply = run(user("What time is it in Europe/Paris?"))
    assert reply.finish == "tool_calls"
    assert reply.text == "Let me check the clock."
    assert list(reply.calls) == [0]
    call_id, name, arguments = reply.calls[0]
    assert call_id.startswith("call_")
    assert name == "current_time"
    assert json.loads(arguments) == {"timezone": "Europe/Paris"}
    assert reply.fragments > 2  # header plus several argument pieces
    assert run(user("What time is it in Europe/Paris?")).calls == reply.calls  # reproducible ids


def test_time_defaults_to_utc() -> None:
    reply = run(user("what DATE is it today"))
    assert json.loads(reply.calls[0][2]) == {"timezone": "UTC"}


def test_time_and_arithmetic_make_two_parallel_calls() -> None:
    reply = run(user("What time is it, and what is 2 + 3 * 4?"))
    assert reply.finish == "tool_calls"
    assert [reply.calls[i][1] for i in (0, 1)] == ["current_time", "calculate"]
    assert json.loads(reply.calls[1][2]) == {"expression": "2 + 3 * 4"}
    assert reply.calls[0][0] != reply.calls[1][0]


def test_calculate_keyword() -> None:
    reply = run(user("Please calculate sqrt(16) + 1."), tools=[_tool("calculate")])
    assert reply.calls[0][1:] == ["calculate", json.dumps({"expression": "sqrt(16) + 1"})]


def test_answer_uses_tool_results() -> None:
    messages = user("What time is it, and what is 2 + 3 * 4?")
    messages.append(
        {
            "role": "assistant",
            "content": "Let me check the clock.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "current_time", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "calculate", "arguments": "{}"}},
            ],
        }
    )
    messages.append({"role": "tool", "tool_call_id": "c1", "content": "2026-11-22T02:30:00+00:00 (Sunday)"})
    messages.append({"role": "tool", "tool_call_id": "c2", "content": "14"})
    reply = run(messages)
    assert reply.text == "The current time is 2026-11-22T02:30:00+00:00 (Sunday). The result is 14."
    assert reply.finish == "stop"
    assert reply.calls == {}


def test_tool_error_is_echoed() -> None:
    messages = user("[call:nope {}]")
    messages.append(
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "nope"}}]}
    )
    messages.append({"role": "tool", "tool_call_id": "c1", "content": "Unknown tool 'nope'"})
    assert run(messages).text == "The tool reported an error: Unknown tool 'nope'."


@pytest.mark.parametrize(
    ("result", "answer"),
    [
        (
            "The user rejected this tool call: not with these numbers",
            "You rejected the calculate call (your reason: not with these numbers), so I did not run it.",
        ),
        ("The user rejected this tool call.", "You rejected the calculate call, so I did not run it."),
        ("approval timed out", "The tool reported an error: approval timed out."),
    ],
)
def test_a_rejected_call_is_answered_as_rejected(result: str, answer: str) -> None:
    """The reply after a person's reject says so and repeats the reason (the page's browser test reads it),
    rather than presenting the reject as the tool's result."""
    messages = user("what is 2+3*4?")
    call = {"id": "c1", "type": "function", "function": {"name": "calculate"}}
    messages.append({"role": "assistant", "tool_calls": [call]})
    messages.append({"role": "tool", "tool_call_id": "c1", "content": result})
    assert run(messages).text == answer


def test_unoffered_tool_gets_plain_answer() -> None:
    reply = run(user("What time is it?"), tools=[_tool("calculate")])
    assert reply.finish == "stop"
    assert reply.calls == {}
    assert "no current_time tool" in reply.text


def test_explicit_call_trigger_calls_unknown_tool() -> None:
    reply = run(user('Try this: [call:nope {"a": [1, 2]}] please'))
    assert reply.finish == "tool_calls"
    assert reply.calls[0][1] == "nope"
    assert json.loads(reply.calls[0][2]) == {"a": [1, 2]}


def test_long_trigger() -> None:
    reply = run(user("Go on [long]"))
    assert 380 <= len(reply.text.split()) <= 420
    assert reply.usage is not None
    assert reply.usage[1] == 400


def test_think_trigger_streams_a_short_reasoning_first() -> None:
    parts = asyncio.run(_parts(DemoAdapter(token_delay=0), user("Hello [think]"), TOOLS))
    reasoning = [n for n, part in enumerate(parts) if isinstance(part, ReasoningPart)]
    text = [n for n, part in enumerate(parts) if isinstance(part, TextPart)]
    assert reasoning and text and max(reasoning) < min(text)
    reply = _collect(parts)
    assert "answer directly" in reply.reasoning
    assert reply.text.startswith("You said: Hello [think].")
    assert reply.usage is not None and reply.usage[1] == len(reasoning) + len(text)
    with_tool = run(user("[think] What time is it?"))
    assert "current_time" in with_tool.reasoning and with_tool.finish == "tool_calls"
    assert run(user("Hello")).reasoning == ""


# --- pacing: an absolute schedule, checked on a simulated clock ----------------------------------------


@dataclass
class SimulatedClock:
    """Stands in for the loop's clock and `asyncio.sleep`: sleeping advances the time it reports."""

    now: float = 0.0
    sleeps: list[float] = field(default_factory=list)

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _paced(
    monkeypatch: pytest.MonkeyPatch, text: str, delay: float, stall_after: int = 0, stall: float = 0.0
) -> tuple[SimulatedClock, list[StreamPart]]:
    clock = SimulatedClock()

    async def scenario() -> list[StreamPart]:
        monkeypatch.setattr(asyncio.get_running_loop(), "time", clock.time)
        monkeypatch.setattr(asyncio, "sleep", clock.sleep)
        received: list[StreamPart] = []
        adapter = DemoAdapter(token_delay=delay, wait_until=sleep_until)
        async for part in adapter.stream(_request(user(text), TOOLS)):
            received.append(part)
            if len(received) == stall_after:
                clock.now += stall  # the consumer (or the whole loop) was busy for a while
        return received

    return clock, asyncio.run(scenario())


def test_pacing_runs_on_an_absolute_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    steady, parts = _paced(monkeypatch, "Hello there", 0.02)
    paced = len([p for p in parts if isinstance(p, TextPart | ToolCallPart)])
    assert steady.now == pytest.approx(paced * 0.02)
    stalled, again = _paced(monkeypatch, "Hello there", 0.02, stall_after=2, stall=0.1)
    assert _collect(again) == _collect(parts)
    # Part n is due at n x delay: the parts that fell due during the stall go out at once, and the
    # stream still ends on time instead of 0.1 s late.
    assert stalled.sleeps[2:6] == [0.0] * 4
    assert stalled.now == pytest.approx(paced * 0.02)


def test_slow_trigger_paces_ten_times_slower(monkeypatch: pytest.MonkeyPatch) -> None:
    clock, parts = _paced(monkeypatch, "Hello [slow]", 0.001)
    paced = len([p for p in parts if isinstance(p, TextPart)])
    assert clock.now == pytest.approx(paced * 0.01)


def test_cancelling_a_paced_stream_stops_it_at_once() -> None:
    async def scenario() -> tuple[int, int, bool]:
        stream = DemoAdapter(token_delay=0.05).stream(_request(user("Hello"), TOOLS))
        received: list[StreamPart] = []
        mid_way = asyncio.Event()

        async def consume() -> None:
            async for part in stream:
                received.append(part)
                if len(received) == 3:
                    mid_way.set()

        task = asyncio.create_task(consume())
        await mid_way.wait()
        task.cancel()
        await asyncio.sleep(0)  # one turn of the loop: the pending sleep raises CancelledError
        done = task.done()
        with pytest.raises(asyncio.CancelledError):
            await task
        total = len(await _parts(DemoAdapter(token_delay=0), user("Hello"), TOOLS))
        return len(received), total, done

    received, total, done = asyncio.run(scenario())
    assert done
    assert 3 <= received < total  # cut off mid-way
