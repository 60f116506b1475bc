"""Traces, recorded by the OpenTelemetry SDK's own InMemorySpanExporter (no mock of the SDK): a request
span from the FastAPI instrumentation, a turn span with its model and tool calls as children carrying the
GenAI semantic conventions' attributes, the trace id on a failed turn's error event, and no prompt or
completion text unless PARLEY_TRACE_CONTENT asks. How it proves it: the spans are read back from the
exporter after real requests to a live server and their parent links and attributes compared exactly."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from app.observability.setup import tracing_configured, use_tracer_provider
from app.settings import Settings
from tests.support.server import live_server


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    use_tracer_provider(provider)
    try:
        yield exporter
    finally:
        use_tracer_provider(None)
        provider.shutdown()


def _by_name(finished: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [span for span in finished if span.name.startswith(prefix)]


def _attributes(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


def test_a_turn_is_a_span_with_its_model_and_tool_calls_as_children(
    spans: InMemorySpanExporter, database_url: str
) -> None:
    settings = Settings(database_url=database_url, demo_token_delay=0.0)
    with live_server(settings) as server, httpx.Client(base_url=server.base_url, timeout=30) as client:
        session_id = client.post("/v1/sessions", json={}).json()["id"]
        done = client.post(
            f"/v1/sessions/{session_id}/messages?wait=true", json={"content": "what time is it?"}
        ).json()
    finished = spans.get_finished_spans()

    requests = [s for s in finished if s.kind == SpanKind.SERVER]
    assert any(s.name == "POST /v1/sessions/{session_id}/messages" for s in requests), [
        s.name for s in requests
    ]
    [turn] = _by_name(finished, "invoke_agent")
    attributes = _attributes(turn)
    assert attributes["gen_ai.operation.name"] == "invoke_agent"
    assert attributes["gen_ai.request.model"] == "parley/demo"
    assert attributes["gen_ai.conversation.id"] == session_id
    assert attributes["parley.turn_id"] == done["turn_id"]
    assert attributes["parley.turn.status"] == "completed"

    models = _by_name(finished, "chat parley/demo")
    tools = _by_name(finished, "execute_tool current_time")
    assert len(models) == 2 and len(tools) == 1
    assert turn.context is not None
    for child in [*models, *tools]:
        assert child.parent is not None and child.parent.span_id == turn.context.span_id
        assert child.context is not None and child.context.trace_id == turn.context.trace_id
    first, answer = sorted(models, key=lambda s: s.start_time or 0)
    assert _attributes(first)["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert _attributes(answer)["gen_ai.response.finish_reasons"] == ("stop",)
    for model in models:
        model_attributes = _attributes(model)
        assert model_attributes["gen_ai.operation.name"] == "chat"
        assert model_attributes["gen_ai.request.model"] == "parley/demo"
        assert model_attributes["gen_ai.provider.name"] == "parley"
        assert int(str(model_attributes["gen_ai.usage.input_tokens"])) > 0
        assert int(str(model_attributes["gen_ai.usage.output_tokens"])) > 0
        # No prompt or completion text unless PARLEY_TRACE_CONTENT=1.
        assert "gen_ai.input.messages" not in model_attributes
        assert "gen_ai.output.messages" not in model_attributes
    tool_attributes = _attributes(tools[0])
    assert tool_attributes["gen_ai.tool.name"] == "current_time"
    assert tool_attributes["parley.tool.outcome"] == "ok"


def test_prompts_and_completions_go_into_spans_only_when_asked(
    spans: InMemorySpanExporter, database_url: str
) -> None:
    settings = Settings(database_url=database_url, demo_token_delay=0.0, trace_content=True)
    with live_server(settings) as server, httpx.Client(base_url=server.base_url, timeout=30) as client:
        session_id = client.post("/v1/sessions", json={"tools": []}).json()["id"]
        client.post(f"/v1/sessions/{session_id}/messages?wait=true", json={"content": "say hello"})
    [model] = _by_name(spans.get_finished_spans(), "chat parley/demo")
    assert "say hello" in str(_attributes(model)["gen_ai.input.messages"])
    assert "gen_ai.output.messages" in _attributes(model)


def test_a_failed_turns_error_event_carries_its_trace_id(
    spans: InMemorySpanExporter, database_url: str
) -> None:
    """One model call allowed and the demo calls a tool first: the turn fails with max_tool_rounds."""
    settings = Settings(database_url=database_url, demo_token_delay=0.0, max_tool_rounds=1)
    with live_server(settings) as server, httpx.Client(base_url=server.base_url, timeout=30) as client:
        session_id = client.post("/v1/sessions", json={}).json()["id"]
        done = client.post(
            f"/v1/sessions/{session_id}/messages?wait=true", json={"content": "what time is it?"}
        ).json()
        lines = []
        with client.stream("GET", f"/v1/sessions/{session_id}/events?after=0&format=ndjson") as stream:
            for line in stream.iter_lines():
                lines.append(line)
                if '"type":"turn_done"' in line:
                    break
    assert done["status"] == "failed"
    [turn] = _by_name(spans.get_finished_spans(), "invoke_agent")
    assert turn.context is not None
    errors = [line for line in lines if '"type":"error"' in line]
    assert len(errors) == 1
    assert f'"trace_id":"{turn.context.trace_id:032x}"' in errors[0]


def test_tracing_follows_the_standard_otel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    assert not tracing_configured()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    assert tracing_configured()
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not tracing_configured()
