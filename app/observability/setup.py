"""Turning observability on: the metrics of a running app, and tracing when OpenTelemetry is configured.

Tracing is on when the standard variables name an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; OTEL_SDK_DISABLED=true turns it off): spans go out in batches over
OTLP/HTTP (the exporter reads OTEL_EXPORTER_OTLP_HEADERS, OTEL_SERVICE_NAME and the rest itself). A test
(or an embedding program) may install its own provider instead (`use_tracer_provider`). The FastAPI
instrumentation gives each request its span; per-chunk send/receive spans are left out (a stream would
make thousands).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from app.observability import hooks
from app.settings import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI
    from opentelemetry.sdk.trace import TracerProvider

    from app.observability.metrics import Metrics

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
# Probes and scrapes are not what a trace is for.
EXCLUDED_URLS = "/healthz,/readyz,/metrics"


class _Tracing:
    """The provider spans go to: an installed one, else the OTLP one built once per process."""

    installed: TracerProvider | None = None
    from_environment: TracerProvider | None = None


def tracing_configured() -> bool:
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(os.environ.get(name) for name in ENDPOINT_VARIABLES)


def use_tracer_provider(provider: TracerProvider | None) -> None:
    """Spans of apps created from now on go to `provider` (None: back to the environment's choice)."""
    _Tracing.installed = provider
    hooks.use_tracer(provider.get_tracer(hooks.TRACER_NAME) if provider is not None else None)


def tracer_provider() -> TracerProvider | None:
    if _Tracing.installed is not None:
        return _Tracing.installed
    if not tracing_configured():
        return None
    if _Tracing.from_environment is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(resource=Resource.create({"service.name": "parley"}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        _Tracing.from_environment = provider
        hooks.use_tracer(provider.get_tracer(hooks.TRACER_NAME))
    return _Tracing.from_environment


def install_tracing(app: FastAPI) -> bool:
    """A span per request on `app` when tracing is on; whether it is."""
    provider = tracer_provider()
    if provider is None:
        return False
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(
        app, tracer_provider=provider, excluded_urls=EXCLUDED_URLS, exclude_spans=["receive", "send"]
    )
    return True


def start_observability(settings: Settings) -> Metrics | None:
    """At the lifespan's start: the metrics registry (PARLEY_METRICS=1) the hooks record into."""
    registry = None
    if settings.metrics:
        from app.observability.metrics import Metrics

        registry = Metrics()
    hooks.activate(registry, trace_content=settings.trace_content)
    return registry


def stop_observability() -> None:
    """At the lifespan's end: the hooks record nothing more; spans still batched are sent."""
    hooks.activate(None)
    provider = _Tracing.installed or _Tracing.from_environment
    if provider is not None:
        provider.force_flush()
