"""The tools a service offers beyond the built-ins, from the tools file: built, started, stopped, listed.

`ToolCatalog.load` validates the tools file (a bad entry raises `ToolsConfigError` before the server
serves), `start` connects the MCP servers (each in its own task) and opens the HTTP tools' connection
pool, `stop` ends both (stdio servers' process groups included), and `listing` is GET /v1/tools.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.tools.config import load_tools_config
from app.tools.external import ExternalTool
from app.tools.registry import Tool, ToolRegistry

if TYPE_CHECKING:
    from app.tools.http_tools import HttpTools
    from app.tools.mcp import McpServers

__all__ = ["ToolCatalog"]


class ToolCatalog:
    def __init__(self, registry: ToolRegistry, mcp: McpServers | None, http: HttpTools | None) -> None:
        self.registry = registry
        self.mcp = mcp
        self.http = http
        for provider in (mcp, http):
            if provider is not None:
                registry.add_provider(provider)

    @classmethod
    def load(
        cls,
        registry: ToolRegistry,
        path: Path | None,
        *,
        retry_max: float = 30.0,
        connect_timeout: float = 10.0,
    ) -> ToolCatalog:
        """The MCP SDK and aiohttp are imported only when the file uses them: the SDK alone would
        double the server's cold start for every deployment without an MCP server."""
        config = load_tools_config(path)
        mcp: McpServers | None = None
        http: HttpTools | None = None
        if config.mcp_servers:
            from app.tools.mcp import McpServers

            mcp = McpServers(config.mcp_servers, backoff_max=retry_max, connect_timeout=connect_timeout)
        if config.http_tools:
            from app.tools.http_tools import HttpTools

            http = HttpTools(config.http_tools, config.allow_private_hosts)
        return cls(registry, mcp, http)

    def start(self) -> None:
        for provider in (self.mcp, self.http):
            if provider is not None:
                provider.start()

    async def stop(self) -> None:
        for provider in (self.mcp, self.http):
            if provider is not None:
                await provider.stop()

    def listing(self) -> dict[str, Any]:
        """GET /v1/tools's body (app/protocol/tools.py `ToolList`): every tool, each MCP server's state."""
        tools: list[dict[str, Any]] = []
        for name in self.registry.names():
            tool = self.registry.lookup(name)
            # The registry's own decision, the one it enforces where the tool runs, for every session
            # that selects the tool (by name, by its server, or later) before its own approval names.
            approval = self.registry.requires_approval(name)
            if isinstance(tool, Tool):
                parameters = tool.schema()["function"]["parameters"]
                tools.append(_info(name, "builtin", tool.description, parameters, None, approval))
            elif isinstance(tool, ExternalTool):
                tools.append(
                    _info(name, tool.source, tool.description, tool.parameters, tool.group, approval)
                )
        servers = [
            {
                "name": server.name,
                "transport": server.config.transport,
                "state": server.state,
                "error": server.error,
                "tool_count": len(server.tools),
            }
            for server in (self.mcp.servers.values() if self.mcp is not None else ())
        ]
        return {"tools": tools, "mcp_servers": servers}


def _info(
    name: str, source: str, description: str, parameters: Any, server: str | None, approval: bool
) -> dict[str, Any]:
    return {
        "name": name,
        "source": source,
        "description": description,
        "parameters": parameters,
        "server": server,
        "requires_approval": approval,
    }
