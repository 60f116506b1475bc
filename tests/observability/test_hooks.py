"""The hooks and the observed model adapter, against the in-process demo model (a real adapter, not a
fake): a finished call is timed and its usage counted under a bounded label, a call closed early (a stop)
is timed to its close and gets no usage estimate, and without active metrics every hook records nothing.
How it proves it: the registry's own sample values are read back and compared exactly."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator
from contextlib import aclosing

import pytest

from app.llm.demo import DemoAdapter
from app.llm.observed import ObservedAdapter
from app.llm.types import ModelRequest, ResolvedModel, StreamPart, TextPart, UsagePart
from app.observability import hooks
from app.observability.metrics import Metrics

pytestmark = pytest.mark.anyio

REQUEST = ModelRequest(ResolvedModel("parley/demo", 8192), [{"role": "user", "content": "[long] hi"}], [], 5)


def _never_estimate(model: str, request: ModelRequest, completion: str) -> tuple[int, int]:
    raise AssertionError("the demo model sends its usage; a stopped call has none to estimate")


@pytest.fixture
def metrics() -> Iterator[Metrics]:
    registry = Metrics()
    hooks.activate(registry)
    try:
        yield registry
    finally:
        hooks.activate(None)


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    found = metrics.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


async def _all(stream: AsyncGenerator[StreamPart, None]) -> list[StreamPart]:
    async with aclosing(stream) as parts:
        return [part async for part in parts]


async def test_a_finished_call_is_timed_and_its_usage_counted(metrics: Metrics) -> None:
    adapter = ObservedAdapter(DemoAdapter(0.0), "parley/demo", "parley", _never_estimate)
    parts = await _all(adapter.stream(REQUEST))
    [usage] = [p for p in parts if isinstance(p, UsagePart)]
    assert not usage.estimated
    assert sample(metrics, "parley_model_first_token_seconds_count", model="parley/demo") == 1
    assert sample(metrics, "parley_model_response_seconds_count", model="parley/demo") == 1
    assert sample(metrics, "parley_model_tokens_total", model="parley/demo", direction="input") == (
        usage.prompt_tokens
    )
    assert sample(metrics, "parley_model_tokens_total", model="parley/demo", direction="output") == (
        usage.completion_tokens
    )
    assert sample(metrics, "parley_cancel_disconnect_seconds_count") == 0


async def test_a_call_closed_early_is_timed_to_its_close_and_not_estimated(metrics: Metrics) -> None:
    adapter = ObservedAdapter(DemoAdapter(0.001), "parley/demo", "parley", _never_estimate)
    async with aclosing(adapter.stream(REQUEST)) as parts:
        async for part in parts:
            if isinstance(part, TextPart):
                break  # a stop: the consumer closes the stream at a yield
    assert sample(metrics, "parley_cancel_disconnect_seconds_count") == 1
    assert sample(metrics, "parley_model_tokens_total", model="parley/demo", direction="input") == 0


def test_a_tool_call_is_counted_by_outcome_and_a_cancelled_one_as_cancelled(metrics: Metrics) -> None:
    with hooks.observe_tool("calculate", "builtin", "call_1") as observed:
        observed.outcome = "error"
    with pytest.raises(KeyboardInterrupt), hooks.observe_tool("calculate", "builtin", "call_2"):
        raise KeyboardInterrupt
    assert (
        sample(metrics, "parley_tool_calls_total", tool="calculate", source="builtin", outcome="error") == 1
    )
    assert (
        sample(metrics, "parley_tool_calls_total", tool="calculate", source="builtin", outcome="cancelled")
        == 1
    )


def test_a_turn_that_raises_ends_as_failed(metrics: Metrics) -> None:
    with pytest.raises(RuntimeError), hooks.observe_turn("s_1", "t_1", "parley/demo"):
        raise RuntimeError("boom")
    assert sample(metrics, "parley_turns_started_total") == 1
    assert sample(metrics, "parley_turns_ended_total", status="failed") == 1


def test_without_active_metrics_the_hooks_record_nothing() -> None:
    unused = Metrics()
    hooks.activate(None)
    hooks.stream_opened(resumed=True)
    hooks.events_sent(3, resync=True)
    hooks.streams_dropped(2)
    hooks.commit_observed("batch", 0.01)
    hooks.message_queued(4)
    hooks.turn_cancelled()
    with hooks.observe_turn("s_1", "t_1", "parley/demo") as turn:
        turn.status = "completed"
    assert sample(unused, "parley_turns_started_total") == 0
    assert hooks.active_metrics() is None
