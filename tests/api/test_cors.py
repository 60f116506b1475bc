"""CORS: off unless PARLEY_CORS_ORIGINS lists origins; a listed origin may call with a key and read ids."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from app.settings import Settings
from tests.support.server import LiveServer, live_server

pytestmark = pytest.mark.anyio

APP = "https://app.example"
PREFLIGHT = {
    "Origin": APP,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type, idempotency-key",
}


@pytest.fixture
def cors_server(settings: Settings) -> Iterator[LiveServer]:
    with live_server(settings.model_copy(update={"cors_origins": [APP]})) as running:
        yield running


async def test_without_configuration_no_cors_headers(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        preflight = await client.options("/v1/sessions", headers=PREFLIGHT)
        assert preflight.status_code == 405
        listed = await client.get("/v1/sessions", headers={"Origin": APP})
        assert listed.status_code == 200
        for response in (preflight, listed):
            assert not [h for h in response.headers if h.startswith("access-control-")]


async def test_an_allowed_origin_gets_the_preflight_and_reads_the_headers_it_needs(
    cors_server: LiveServer,
) -> None:
    async with httpx.AsyncClient(base_url=cors_server.base_url, timeout=30) as client:
        preflight = await client.options("/v1/sessions", headers=PREFLIGHT)
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == APP
        assert "POST" in preflight.headers["access-control-allow-methods"]
        allowed = preflight.headers["access-control-allow-headers"].lower()
        for header in ("authorization", "content-type", "idempotency-key", "last-event-id"):
            assert header in allowed
        assert "access-control-allow-credentials" not in preflight.headers  # bearer keys, not cookies

        created = await client.post("/v1/sessions", json={}, headers={"Origin": APP})
        assert created.status_code == 201
        assert created.headers["access-control-allow-origin"] == APP
        exposed = created.headers["access-control-expose-headers"].lower()
        assert {"x-request-id", "idempotent-replayed", "retry-after"} <= set(
            exposed.replace(" ", "").split(",")
        )

        # The middleware's own refusals carry the headers too, so the page can read the error.
        refused = await client.post(
            "/v1/sessions", content=b"x", headers={"Origin": APP, "Content-Type": "text/plain"}
        )
        assert refused.status_code == 415
        assert refused.headers["access-control-allow-origin"] == APP


async def test_another_origin_is_not_allowed(cors_server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=cors_server.base_url, timeout=30) as client:
        preflight = await client.options(
            "/v1/sessions", headers={**PREFLIGHT, "Origin": "https://evil.example"}
        )
        assert preflight.status_code == 400
        assert "access-control-allow-origin" not in preflight.headers
        listed = await client.get("/v1/sessions", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in listed.headers
