"""app/tools/catalog.py: the tools file loaded into a registry, started, listed (GET /v1/tools), stopped."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.protocol.tools import ToolList
from app.tools.catalog import ToolCatalog
from app.tools.config import ToolsConfigError
from app.tools.registry import build_default_registry
from tests.support.server import free_port

TOOLS = """
mcp_servers:
  down: {url: "http://127.0.0.1:%d/mcp"}
http_tools:
  order:
    url: https://orders.example.com/tool
    description: Look an order up.
    secret: sixteen-characters!
    approval: always
"""


def test_listing_of_a_loaded_file(tmp_path: Path) -> None:
    path = tmp_path / "tools.yaml"
    path.write_text(TOOLS % free_port())
    registry = build_default_registry()
    catalog = ToolCatalog.load(registry, path, retry_max=0.2)

    async def run() -> None:
        catalog.start()
        try:
            for _ in range(200):
                if ToolList.model_validate(catalog.listing()).mcp_servers[0].state == "error":
                    break
                await asyncio.sleep(0.05)
            listing = ToolList.model_validate(catalog.listing())
            assert [(t.name, t.source, t.requires_approval) for t in listing.tools] == [
                ("calculate", "builtin", False),
                ("current_time", "builtin", False),
                ("order", "http", True),
            ]
            [down] = listing.mcp_servers
            assert (down.name, down.transport, down.state, down.tool_count) == ("down", "http", "error", 0)
            assert down.error is not None and "ConnectError" in down.error
            assert registry.requires_approval("order") and not registry.requires_approval("calculate")
            assert registry.builtin_names() == ["calculate", "current_time"]
        finally:
            await catalog.stop()

    asyncio.run(run())


def test_a_bad_file_stops_the_load(tmp_path: Path) -> None:
    path = tmp_path / "tools.yaml"
    path.write_text("http_tools: {order: {url: 'https://x/t'}}")
    with pytest.raises(ToolsConfigError, match=r"http_tools\.order\.description: Field required"):
        ToolCatalog.load(build_default_registry(), path)
