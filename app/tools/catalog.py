"""The tools a service offers beyond the built-ins, from the tools file: built, started, stopped, listed.

`ToolCatalog.load` validates the tools file (a bad entry raises `ToolsConfigError` before the server
serves), `start` connects the MCP servers (each in its own task) and opens the HTTP tools' connection
pool, `stop` ends both (stdio servers' process groups included), and `listing` is GET /v1/tools.
"""

from __future__ import annotations

from pathlib import Path

from app.protocol.tools import McpServerInfo, ToolInfo, ToolList
from app.tools.config import load_tools_config
from app.tools.external import ExternalTool
from app.tools.http_tools import HttpTools
from app.tools.mcp import McpServers
from app.tools.registry import Tool, ToolRegistry

__all__ = ["ToolCatalog"]


class ToolCatalog:
    def __init__(self, registry: ToolRegistry, mcp: McpServers, http: HttpTools) -> None:
        self.registry = registry
        self.mcp = mcp
        self.http = http
        registry.add_provider(mcp)
        registry.add_provider(http)

    @classmethod
    def load(cls, registry: ToolRegistry, path: Path | None, *, retry_max: float = 30.0) -> ToolCatalog:
        config = load_tools_config(path)
        return cls(
            registry,
            McpServers(config.mcp_servers, backoff_max=retry_max),
            HttpTools(config.http_tools, config.allow_private_hosts),
        )

    def start(self) -> None:
        self.mcp.start()
        self.http.start()

    async def stop(self) -> None:
        await self.mcp.stop()
        await self.http.stop()

    def listing(self) -> ToolList:
        tools: list[ToolInfo] = []
        for name in self.registry.names():
            tool = self.registry.lookup(name)
            if isinstance(tool, Tool):
                schema = tool.schema()["function"]
                tools.append(
                    ToolInfo(
                        name=name,
                        source="builtin",
                        description=tool.description,
                        parameters=schema["parameters"],
                        requires_approval=False,
                    )
                )
            elif isinstance(tool, ExternalTool):
                tools.append(
                    ToolInfo(
                        name=name,
                        source=tool.source,
                        description=tool.description,
                        parameters=tool.parameters,
                        server=tool.group,
                        requires_approval=tool.requires_approval,
                    )
                )
        servers = [
            McpServerInfo(
                name=server.name,
                transport=server.config.transport,
                state=server.state,
                error=server.error,
                tool_count=len(server.tools),
            )
            for server in self.mcp.servers.values()
        ]
        return ToolList(tools=tools, mcp_servers=servers)
