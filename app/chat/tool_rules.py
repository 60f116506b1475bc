"""Checks of a session's (or a message's) client tools and approval rule against its server tools."""

from __future__ import annotations

from collections.abc import Sequence

from app.chat.errors import UnknownTool
from app.errors import DomainError
from app.protocol.tool_requests import ClientTool
from app.tools.registry import ToolRegistry


class ToolNameClash(DomainError):
    code = "tool_name_clash"


def check_client_tools(server_tools: Sequence[str], client_tools: Sequence[ClientTool]) -> None:
    """A client tool may not shadow a server tool of the session: the model could not tell them apart."""
    clash = [t.name for t in client_tools if t.name in server_tools]
    if clash:
        raise ToolNameClash(
            f"Client tool(s) named like the session's server tools: {', '.join(clash)}.",
            details={"names": clash},
        )


def check_approval(names: Sequence[str], server_tools: Sequence[str], tools: ToolRegistry) -> None:
    """Approval names the session's server tools ("*": all of them): a selected name, a selected MCP
    server (`github`, `github/*`) or one of its tools; each call is matched by the tool it resolves to
    (ToolRegistry.requires_approval). Client tools run in the client, which asks its user itself if it
    wants to."""
    unknown = [n for n in names if n != "*" and not tools.covers(server_tools, n)]
    if unknown:
        raise UnknownTool(
            f"Approval names tool(s) the session does not have: {', '.join(unknown)}.",
            details={"unknown": unknown, "available": list(server_tools)},
        )
