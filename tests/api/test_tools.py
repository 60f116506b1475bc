"""GET /v1/tools (app/api/tools.py) over a real socket: behind the API keys like every /v1 route, with
the built-in tools and no MCP server when there is no tools file; its shape is the documented one."""

from __future__ import annotations

import httpx

from app.api.tools import list_tools
from app.protocol.tools import ToolList
from app.settings import Settings
from tests.support.server import live_server

KEY = "tools-test-key-0123456789"


def test_listing_needs_a_key_and_shows_the_builtins(settings: Settings) -> None:
    with live_server(settings.model_copy(update={"api_keys": f"alice:{KEY}"})) as server:
        refused = httpx.get(f"{server.base_url}/v1/tools", timeout=10)
        assert refused.status_code == 401
        got = httpx.get(f"{server.base_url}/v1/tools", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
        spec = httpx.get(f"{server.base_url}/openapi.json", timeout=10).json()
    assert got.status_code == 200
    listing = ToolList.model_validate(got.json())
    assert [(t.name, t.source, t.server) for t in listing.tools] == [
        ("calculate", "builtin", None),
        ("current_time", "builtin", None),
    ]
    assert listing.tools[0].parameters["required"] == ["expression"]
    assert listing.mcp_servers == []
    described = spec["paths"]["/v1/tools"]["get"]["description"]
    assert described == (list_tools.__doc__ or "").strip()
