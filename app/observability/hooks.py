"""The seams' one entry to observability: metrics and spans, updated by small calls from where things
happen (a turn's task, the model gateway's adapters, the agent's tool step, the event stream route, the
broker, the write-behind's commit). Each call is cheap and does nothing that can fail a turn.

What the hooks write to is process-wide, as the exporters are: the Metrics the lifespan activated (none
unless PARLEY_METRICS=1) and OpenTelemetry's global tracer provider (a no-op unless tracing.py installed
one). Spans follow the GenAI semantic conventions: a turn is `invoke_agent`, a model call `chat {model}`,
a tool call `execute_tool {tool}`; no prompt or completion text unless PARLEY_TRACE_CONTENT=1.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from app.observability.context import bind_turn

if TYPE_CHECKING:
    from app.observability.metrics import Metrics

TRACER_NAME = "parley"


@dataclass
class _Active:
    metrics: Metrics | None = None
    trace_content: bool = False
    # OpenTelemetry's global tracer (a no-op until a provider is set) unless setup.py installed one.
    tracer: Tracer = field(default_factory=lambda: trace.get_tracer(TRACER_NAME))


_active = _Active()


def activate(metrics: Metrics | None, *, trace_content: bool = False) -> None:
    """What the hooks record into from now on (the lifespan's; None: no metrics)."""
    _active.metrics = metrics
    _active.trace_content = trace_content


def use_tracer(tracer: Tracer | None) -> None:
    """The tracer of the spans (setup.py's provider's); None: OpenTelemetry's global one."""
    _active.tracer = tracer if tracer is not None else trace.get_tracer(TRACER_NAME)


def active_metrics() -> Metrics | None:
    return _active.metrics


# --- turns ------------------------------------------------------------------------------------------


@dataclass
class TurnObservation:
    """Set `status` before the block ends (the turn's end status; `failed` if it raised)."""

    span: Span
    started: float
    status: str | None = None


@contextmanager
def observe_turn(session_id: str, turn_id: str, model: str) -> Iterator[TurnObservation]:
    """A turn's task: its span (parent of its model and tool calls), its log ids, its counts."""
    metrics = _active.metrics
    if metrics is not None:
        metrics.turns_started.inc()
    attributes = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "parley",
        "gen_ai.conversation.id": session_id,
        "gen_ai.request.model": model,
        "parley.turn_id": turn_id,
    }
    with (
        bind_turn(session_id, turn_id),
        _active.tracer.start_as_current_span(
            "invoke_agent parley", kind=SpanKind.INTERNAL, attributes=attributes, record_exception=False
        ) as span,
    ):
        observed = TurnObservation(span, time.monotonic())
        try:
            yield observed
        except BaseException:
            observed.status = observed.status or "failed"
            raise
        finally:
            status = observed.status or "unknown"
            span.set_attribute("parley.turn.status", status)
            if status == "failed":
                span.set_status(Status(StatusCode.ERROR, "turn failed"))
            if metrics is not None:
                metrics.turns_ended.labels(status).inc()
                metrics.turn_seconds.labels(status).observe(time.monotonic() - observed.started)


def turn_cancelled() -> None:
    """A stop that stopped a running turn."""
    if _active.metrics is not None:
        _active.metrics.cancels.inc()


def branch_operation(operation: str) -> None:
    """A branch operation (regenerate, edit, activate, fork) was done."""
    if _active.metrics is not None:
        _active.metrics.branch_operations.labels(operation).inc()


def message_queued(depth: int) -> None:
    """A message joined a session's waiting line, which now holds `depth`."""
    if _active.metrics is not None:
        _active.metrics.queue_depth.observe(depth)


# --- model calls ------------------------------------------------------------------------------------


@dataclass
class ModelCall:
    """One model call's observation; the adapter wrapper (app/llm/observed.py) feeds it."""

    model: str
    label: str
    span: Span
    started: float = field(default_factory=time.monotonic)
    first_at: float | None = None
    finish_reason: str | None = None

    def first_output(self) -> None:
        if self.first_at is None:
            self.first_at = time.monotonic()
            metrics = _active.metrics
            if metrics is not None:
                metrics.first_token_seconds.labels(self.label).observe(self.first_at - self.started)

    def finished(self, reason: str | None) -> None:
        self.finish_reason = reason or self.finish_reason

    def usage(self, prompt: int, completion: int, *, estimated: bool = False) -> None:
        self.span.set_attribute("gen_ai.usage.input_tokens", prompt)
        self.span.set_attribute("gen_ai.usage.output_tokens", completion)
        if estimated:
            self.span.set_attribute("parley.usage.estimated", True)
        metrics = _active.metrics
        if metrics is not None:
            metrics.tokens.labels(self.label, "input").inc(prompt)
            metrics.tokens.labels(self.label, "output").inc(completion)
            if estimated:
                metrics.tokens_estimated.labels(self.label, "input").inc(prompt)
                metrics.tokens_estimated.labels(self.label, "output").inc(completion)

    def output_text(self, text: str) -> None:
        if _active.trace_content:
            message = {"role": "assistant", "parts": [{"type": "text", "content": text}]}
            self.span.set_attribute("gen_ai.output.messages", json.dumps([message], ensure_ascii=False))

    def failed(self, code: str) -> None:
        self.span.set_status(Status(StatusCode.ERROR, code))
        self.span.set_attribute("error.type", code)
        if _active.metrics is not None:
            _active.metrics.provider_errors.labels(self.label, code).inc()

    def stopped(self, disconnect_seconds: float) -> None:
        """The consumer closed the stream early (a stop): the time its upstream took to be closed."""
        self.span.set_attribute("parley.model.stopped", True)
        if _active.metrics is not None:
            _active.metrics.disconnect_seconds.observe(disconnect_seconds)


@contextmanager
def observe_model_call(
    model: str, label: str, provider: str | None, messages: Sequence[dict[str, Any]]
) -> Iterator[ModelCall]:
    """A model call's span (`chat {model}`, a child of the turn's) and timings. `label` is the bounded
    metric label for the model."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": model,
        "gen_ai.provider.name": provider or "unknown",
        "gen_ai.system": provider or "unknown",
    }
    if _active.trace_content:
        attributes["gen_ai.input.messages"] = json.dumps(list(messages), ensure_ascii=False, default=str)
    with _active.tracer.start_as_current_span(
        f"chat {model}", kind=SpanKind.CLIENT, attributes=attributes, record_exception=False
    ) as span:
        call = ModelCall(model, label, span)
        try:
            yield call
        finally:
            span.set_attribute("gen_ai.response.model", model)
            if call.finish_reason is not None:
                span.set_attribute("gen_ai.response.finish_reasons", [call.finish_reason])
            metrics = _active.metrics
            if metrics is not None:
                metrics.response_seconds.labels(label).observe(time.monotonic() - call.started)


# --- tool calls -------------------------------------------------------------------------------------


@dataclass
class ToolCallObservation:
    """Set `outcome` (`ok`, `error`) before the block ends; a cancelled call is `cancelled`."""

    outcome: str = "ok"


@contextmanager
def observe_tool(tool: str, source: str, call_id: str) -> Iterator[ToolCallObservation]:
    """A tool call's span (`execute_tool {tool}`) and counts. `tool` must be a bounded name (one the
    registry holds, else `unknown`)."""
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "gen_ai.tool.call.id": call_id,
        "gen_ai.tool.type": "function",
        "parley.tool.source": source,
    }
    started = time.monotonic()
    with _active.tracer.start_as_current_span(
        f"execute_tool {tool}", kind=SpanKind.INTERNAL, attributes=attributes, record_exception=False
    ) as span:
        observed = ToolCallObservation()
        try:
            yield observed
        except BaseException:
            observed.outcome = "cancelled"
            raise
        finally:
            span.set_attribute("parley.tool.outcome", observed.outcome)
            if observed.outcome == "error":
                span.set_status(Status(StatusCode.ERROR, "tool error"))
            metrics = _active.metrics
            if metrics is not None:
                metrics.tool_calls.labels(tool, source, observed.outcome).inc()
                metrics.tool_seconds.labels(tool, source).observe(time.monotonic() - started)


# --- streams and storage ----------------------------------------------------------------------------


def stream_opened(*, resumed: bool) -> None:
    metrics = _active.metrics
    if metrics is not None:
        metrics.open_streams.inc()
        if resumed:
            metrics.resumes.inc()


def auth_failed(reason: str) -> None:
    """A request refused for its credentials; `reason` is one of a fixed set (app.chat.tokens)."""
    metrics = _active.metrics
    if metrics is not None:
        metrics.auth_failures.labels(reason).inc()


def stream_closed() -> None:
    if _active.metrics is not None:
        _active.metrics.open_streams.dec()


def session_memory(*, states: int = 0, channels: int = 0) -> None:
    """Session states (turns.runtime.state_cache) and stream channels (streaming.broker) made (+1) or let go
    (-1)."""
    metrics = _active.metrics
    if metrics is not None:
        if states:
            metrics.session_states.inc(states)
        if channels:
            metrics.stream_channels.inc(channels)


def events_sent(count: int, *, resync: bool = False) -> None:
    metrics = _active.metrics
    if metrics is not None:
        metrics.events_sent.inc(count)
        if resync:
            metrics.resyncs.inc()


def streams_dropped(count: int) -> None:
    """Subscribers cut off because their buffer was full (slow clients)."""
    if count and _active.metrics is not None:
        _active.metrics.streams_dropped.inc(count)


def redis_state(connected: bool) -> None:
    """The fan-out's Redis reader: 1 while it reads the streams, 0 while it polls the event log."""
    if _active.metrics is not None:
        _active.metrics.redis_connected.set(1 if connected else 0)


def fanout_backfilled(count: int) -> None:
    """Events a replica read from the log to fill a hole in what Redis brought it."""
    if _active.metrics is not None:
        _active.metrics.fanout_backfilled.inc(count)


def limits_without_redis(limit: str) -> None:
    """A limit (`messages`, `streams`) decided in this process's memory: Redis was away."""
    if _active.metrics is not None:
        _active.metrics.limits_without_redis.labels(limit).inc()


def fenced_write(what: str) -> None:
    """A turn write the lease fence refused (`turn_done`, `turn_write`, `stream_batch`)."""
    if _active.metrics is not None:
        _active.metrics.fenced_writes.labels(what).inc()


def commit_observed(kind: str, seconds: float) -> None:
    """A database commit of `kind` (batch: the write-behind; turn: a turn's own write; request)."""
    if _active.metrics is not None:
        _active.metrics.commit_seconds.labels(kind).observe(seconds)
