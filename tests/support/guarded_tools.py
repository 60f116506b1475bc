"""An in-process `ToolProvider` (app/tools/external.py) for the approval rule's unit tests: an MCP-like
server `shop` whose `slow` the tools file guards and whose `add` it does not, and an HTTP tool `order` with
`approval: always`. Each call is recorded, so a test sees which tool ran; `grow` adds a guarded tool later,
as an MCP server's `list_changed` does. The real MCP server and HTTP receiver are in the e2e tests."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from app.tools.context import ToolContext, ToolOutcome
from app.tools.external import ExternalTool, ToolCall, ToolSource
from app.tools.registry import ToolRegistry, build_default_registry

SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


class GuardedTools:
    def __init__(self) -> None:
        self.ran: list[str] = []
        self._tools = [
            self._tool("shop__slow", "mcp", group="shop", guarded=True),
            self._tool("shop__add", "mcp", group="shop", guarded=False),
            self._tool("order", "http", group=None, guarded=True),
        ]

    def _tool(self, name: str, source: ToolSource, *, group: str | None, guarded: bool) -> ExternalTool:
        async def call(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
            self.ran.append(name)
            return ToolOutcome(f"{name} ran", is_error=False)

        run: ToolCall = call
        return ExternalTool(name, name, SCHEMA, source, run, requires_approval=guarded, group=group)

    def grow(self, remote: str) -> None:
        """A guarded tool the server lists from now on."""
        self._tools.append(self._tool(f"shop__{remote}", "mcp", group="shop", guarded=True))

    def tools(self) -> Sequence[ExternalTool]:
        return self._tools

    def groups(self) -> Collection[str]:
        return ("shop",)


def guarded_registry() -> tuple[ToolRegistry, GuardedTools]:
    """The built-in tools and `GuardedTools`."""
    registry = build_default_registry()
    provider = GuardedTools()
    registry.add_provider(provider)
    return registry, provider
