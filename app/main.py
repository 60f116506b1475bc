"""The application factory: builds every component in the lifespan and wires the routes."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware

from app.api import (
    branches,
    debug,
    errors,
    events,
    files,
    health,
    kits,
    messages,
    metrics,
    sessions,
    tool_requests,
    turns,
    ui,
)
from app.api.deps import known_query_only
from app.api.middleware import RequestContextMiddleware
from app.api.tools import router as tools_router
from app.chat.auth import KeyRing, load_key_ring
from app.observability.access_log import install_access_log_redaction
from app.observability.context import SessionIdMiddleware, install_request_id_logging
from app.observability.redaction import redact_provider_logs
from app.observability.setup import install_tracing
from app.protocol.openapi import install_openapi
from app.runtime import build_runtime
from app.settings import Settings
from app.tools.catalog import ToolCatalog
from app.tools.registry import ToolRegistry, build_default_registry
from app.turns.runtime.shutdown import drain_on_signals

log = logging.getLogger("parley")
install_request_id_logging()
install_access_log_redaction()
redact_provider_logs()

# What a browser on an allowed origin may send and read (CORS is off unless PARLEY_CORS_ORIGINS is set).
CORS_REQUEST_HEADERS = [
    *("Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID", "X-Request-ID"),
    "X-AI-SDK-Version",  # the AI SDK adapter's version choice (app.api.kits)
]
# X-Parley-Session-Id: the session a kit's chat or thread is bound to (app.api.kits).
CORS_RESPONSE_HEADERS = ["X-Request-ID", "Idempotent-Replayed", "Retry-After", "X-Parley-Session-Id"]


def create_app(settings: Settings | None = None, *, tools: ToolRegistry | None = None) -> FastAPI:
    """`tools` replaces the built-in registry (tests register slow or failing tools through it)."""
    settings = settings or Settings()
    problem = settings.replica_problem()
    if problem is not None:
        # One line and a non-zero exit, also under `python -m uvicorn app.main:app` (no launcher).
        raise SystemExit(f"parley: {problem}")
    # Here rather than in the lifespan: a keys file that cannot be used stops the server before it serves.
    keys = load_key_ring(settings)
    # So is a tools file with a bad entry (ToolsConfigError).
    catalog = ToolCatalog.load(
        tools or build_default_registry(),
        settings.tools_file,
        retry_max=settings.mcp_retry_max,
        connect_timeout=settings.mcp_connect_timeout,
    )

    app = FastAPI(
        title="Parley",
        version="0.1.0",
        summary="Agent sessions with queued messages, stop, and one enriched SSE stream per session.",
        lifespan=_lifespan(settings, keys, catalog),
        dependencies=[Depends(known_query_only)],
        docs_url=None,  # served by app.api.ui with local assets instead of FastAPI's CDN ones
        redoc_url=None,
    )
    errors.install(app)
    app.include_router(health.router)
    app.include_router(sessions.router)
    app.include_router(messages.router)
    app.include_router(events.router)
    app.include_router(turns.router)
    app.include_router(branches.router)
    app.include_router(tools_router)
    app.include_router(tool_requests.router)
    app.include_router(files.router)
    app.include_router(kits.router)
    app.include_router(ui.docs_router)
    if settings.ui:
        app.include_router(ui.router)
    if settings.debug_stats:
        app.include_router(debug.router)
    if settings.metrics:
        app.include_router(metrics.router)
    app.add_middleware(SessionIdMiddleware)
    app.add_middleware(
        RequestContextMiddleware,
        max_body_bytes=settings.max_body_bytes,
        max_header_bytes=settings.max_header_bytes,
        loopback_only=keys.is_open and not settings.allow_open,
    )
    if settings.cors_origins:
        # Outermost, so that the middleware's own refusals (413, 415) carry the CORS headers too.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "PATCH", "DELETE"],
            allow_headers=CORS_REQUEST_HEADERS,
            expose_headers=CORS_RESPONSE_HEADERS,
            max_age=600,
        )
    install_openapi(app)
    # Last: its middleware is then the outermost, so a request's span covers everything, CORS included.
    install_tracing(app)
    return app


def _lifespan(
    settings: Settings, keys: KeyRing, catalog: ToolCatalog
) -> Callable[[FastAPI], AbstractAsyncContextManager[dict[str, Any]]]:
    """Enters the runtime (app.runtime: built, repaired or joined to the replicas, and stopped in order),
    and drains it on SIGTERM or SIGINT."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        async with build_runtime(settings, keys, catalog) as runtime:
            app.state.drain = runtime.drain
            with drain_on_signals(runtime.drain):
                yield {
                    "services": runtime.services,
                    "debug_stats": runtime.debug_stats,
                    "metrics": runtime.metrics,
                }

    return lifespan


app = create_app()
