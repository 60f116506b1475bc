"""A provider's answer that echoes what Parley sent it (self-hosted servers and gateways echo the request's
Authorization header in their errors) never puts the provider key into Parley's log: a real server process,
a real upstream that echoes the header in a 401 and in a 500, and the process's whole log read after.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from app.settings import Settings
from tests.support.process import ServerProcess
from tests.support.server import free_port

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
KEY = "sk-parley-test-0123456789abcdefSECRET"
MODEL = "openai/echo-model"


@asynccontextmanager
async def echoing_upstream() -> AsyncIterator[str]:
    """Answers every chat call with an error whose text holds the request's Authorization header."""
    port = free_port()
    calls = 0

    async def chat(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        auth = request.headers.get("Authorization", "")
        status = 500 if calls % 2 else 401
        message = f"invalid credentials in header Authorization: {auth} (got {auth.split()[-1]})"
        body = {"error": {"message": message, "type": "auth_error", "headers": {"authorization": auth}}}
        return web.json_response(body, status=status)

    app = web.Application()
    app.add_routes([web.post("/v1/chat/completions", chat)])
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


@pytest.mark.processes
@pytest.mark.parametrize("adapter", ["auto", "litellm"])
async def test_a_provider_error_echoing_the_key_is_logged_redacted(
    settings: Settings, tmp_path: Path, adapter: str
) -> None:
    async with echoing_upstream() as api_base:
        models = tmp_path / "models.json"
        provider = {"api_base": api_base, "api_key_env": "PARLEY_TEST_ECHO_KEY", "models": [MODEL]}
        models.write_text(json.dumps({"providers": {"echo": provider}}))
        env = {
            "PARLEY_DATABASE_URL": settings.database_url,
            "PARLEY_MODELS_FILE": str(models),
            "PARLEY_DEFAULT_MODEL": MODEL,
            "PARLEY_STREAM_ADAPTER": adapter,
            "PARLEY_PROVIDER_RETRIES": "1",
            "PARLEY_PROVIDER_RETRY_BACKOFF": "0",
            "PARLEY_TEST_ECHO_KEY": KEY,
        }
        parley = ServerProcess(env, tmp_path / "server.log")
        parley.start(timeout=120)
        try:
            async with httpx.AsyncClient(base_url=parley.base_url, timeout=60) as client:
                sid = (await client.post("/v1/sessions", json={})).json()["id"]
                done = await client.post(
                    f"/v1/sessions/{sid}/messages", params={"wait": "true"}, json={"content": "hi"}
                )
                assert done.json()["status"] == "failed", done.text
                history = (await client.get(f"/v1/sessions/{sid}/messages")).text
        finally:
            parley.terminate()
    log = parley.log()
    assert "invalid credentials" in log, log[-4000:]  # the provider's answer is logged ...
    assert KEY not in log and KEY[:20] not in log  # ... without the key
    assert "[redacted]" in log
    assert KEY not in history


def test_redact_removes_held_secrets_and_credential_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.observability.redaction import redact

    monkeypatch.setenv("GATEWAY_TOKEN", "plain-gateway-credential")
    echoed = (
        '{"headers": {"authorization": "Bearer abc.def-123", "x-api-key": "k-9876543210"}} '
        "token plain-gateway-credential, key sk-ant-0123456789abcdefXYZ"
    )
    cleaned = redact(echoed)
    for secret in ("abc.def-123", "k-9876543210", "plain-gateway-credential", "sk-ant-0123456789abcdefXYZ"):
        assert secret not in cleaned
    assert cleaned.count("[redacted]") == 4
    assert redact("the model answered HTTP 429: rate limit") == "the model answered HTTP 429: rate limit"
