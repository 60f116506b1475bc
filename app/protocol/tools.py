"""GET /v1/tools: every tool a session may choose, and the state of each MCP server."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from app.protocol.events import ToolSource


class ToolInfo(BaseModel):
    name: str = Field(description="The name a session's `tools` lists and the model calls.")
    source: ToolSource
    description: str
    parameters: dict[str, Any] = Field(description="The JSON schema of the arguments.")
    server: str | None = Field(None, description="The MCP server it belongs to.")
    requires_approval: bool = Field(
        description="The tools file's `approval` marks it (`always`, or an MCP server's names and globs): "
        "every call waits for a person, however a session selects the tool (its name, its server, later)."
    )


class McpServerInfo(BaseModel):
    name: str = Field(description="A session may name it (`github` or `github/*`) for all its tools.")
    transport: Literal["http", "stdio"]
    state: Literal["connecting", "connected", "error"]
    error: str | None = Field(None, description="Why it is not connected; it is retried with backoff.")
    tool_count: int


class ToolList(BaseModel):
    tools: list[ToolInfo]
    mcp_servers: list[McpServerInfo]
