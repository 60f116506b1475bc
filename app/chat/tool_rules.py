"""Checks of a session's (or a message's) client tools and approval rule against its server tools."""

from __future__ import annotations

from collections.abc import Sequence

from app.chat.errors import UnknownTool
from app.errors import ApiError
from app.protocol.tool_requests import ClientTool


class ToolNameClash(ApiError):
    code = "tool_name_clash"


def check_client_tools(server_tools: Sequence[str], client_tools: Sequence[ClientTool]) -> None:
    """A client tool may not shadow a server tool of the session: the model could not tell them apart."""
    clash = [t.name for t in client_tools if t.name in server_tools]
    if clash:
        raise ToolNameClash(
            f"Client tool(s) named like the session's server tools: {', '.join(clash)}.",
            details={"names": clash},
        )


def check_approval(names: Sequence[str], server_tools: Sequence[str]) -> None:
    """Approval names the session's server tools ("*": all of them); client tools run in the client,
    which asks its user itself if it wants to."""
    unknown = [n for n in names if n != "*" and n not in server_tools]
    if unknown:
        raise UnknownTool(
            f"Approval names tool(s) the session does not have: {', '.join(unknown)}.",
            details={"unknown": unknown, "available": list(server_tools)},
        )
