"""A real MCP server written with the SDK's `MCPServer`, for the MCP tests and the benchmark.

`python tests/tools/mcp_server.py stdio` serves over stdio; `... http PORT` over streamable HTTP on
127.0.0.1:PORT at /mcp. With MCP_TEST_LOG set, the server appends one line per notable thing it saw
(`start <pid>`, `started slow`, `cancelled <tool>`, `child <pid>`, `ran <a grown tool>`) to that file,
so a test can check what the server saw.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("parley-test")


def note(line: str) -> None:
    path = os.environ.get("MCP_TEST_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(line + "\n")


@server.tool()
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
async def echo(text: str) -> str:
    """Echo the text back."""
    return text


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer; notes its start and a cancellation."""
    note("started slow")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        note("cancelled slow")
        raise
    return f"slept {seconds}"


@server.tool()
async def fail(reason: str) -> str:
    """Always fails with the reason."""
    raise ToolError(reason)


@server.tool()
async def big(chars: int) -> str:
    """A result of that many characters."""
    return "x" * chars


@server.tool()
async def crash() -> str:
    """Exits the server process mid-call."""
    note("crash")
    os._exit(3)


@server.tool()
async def spawn() -> int:
    """Starts a long-lived child process (in the server's group) and gives its pid."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # noqa: ASYNC220
    note(f"child {child.pid}")
    return child.pid


@server.tool()
async def grow(name: str, ctx: Context) -> str:
    """Adds a tool of that name (it notes `ran <name>` when called) and announces the tool list changed."""

    async def added() -> str:
        note(f"ran {name}")
        return "added"

    server.add_tool(added, name=name, description="Added at run time.")
    await ctx.notify_tools_changed()
    return "ok"


if __name__ == "__main__":
    note(f"start {os.getpid()}")
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.settings.log_level = "WARNING"
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
