"""MCP servers' tools, through the official `mcp` SDK (v2): one long-lived task per configured server.

This module owns the connections to the tools file's MCP servers (`McpServers`, a `ToolProvider`):

* each server is held by one task (`McpServer._hold`) that enters AND exits its `Client`: the SDK's
  cancel scopes break when a client is entered in one task and left in another. A server that cannot
  be reached, that does not finish the handshake within the connect timeout (PARLEY_MCP_CONNECT_TIMEOUT),
  or whose connection drops, is retried with exponential backoff while the rest of the service works;
  its state (`connected`, `connecting`, `error` with the reason) is what GET /v1/tools shows;
* the tool list is cached and refetched on reconnect and on `list_changed` (a 2026-07-28 server's
  `subscriptions/listen` stream; the notification on older ones). The listen stream, else a ping every
  few seconds, is also how a dropped connection is noticed;
* a call runs in the turn's own tool task (the SDK's requests may be sent from any task), so a stop of
  the turn cancels it and the SDK tells the server (`notifications/cancelled`, or the request's stream
  closed). Every failure (an `isError` result, a timeout, a dropped connection, a server that is gone)
  is an is_error result the model reads; a result over the server's `max_result_chars` is cut with a
  marker;
* stdio servers are started by the SDK in a session (process group) of their own and their whole group
  is killed when their task leaves its client: at shutdown, at a reconnect, and at a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import logging
import math
import secrets
from collections.abc import Collection, Sequence
from contextlib import AsyncExitStack
from typing import Any, Literal

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError
from mcp.shared.exceptions import MCPError

from app.tools.config import McpServerConfig
from app.tools.context import ToolContext, ToolOutcome
from app.tools.external import ExternalTool, cap_result, clean_name
from app.tools.process_group import MARKER_VARIABLE, find_group, kill_group

__all__ = ["McpServer", "McpServers"]

logger = logging.getLogger(__name__)

McpState = Literal["connecting", "connected", "error"]
_PING_INTERVAL = 5.0
# How long stop() waits for the holder to end before it cancels its task (see stop()): longer than
# the SDK's bounded shutdown of a stdio server (a flush, the grace period, SIGTERM, then SIGKILL).
_STOP_FORCE = 10.0
_STOP_RECANCEL = 2.0
DEFAULT_CONNECT_TIMEOUT = 10.0
_CLIENT_INFO = types.Implementation(name="parley", version="0.1.0")


def _reason(exc: BaseException) -> str:
    """A short reason for GET /v1/tools and the log: the innermost error's type and first line."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def result_text(result: types.CallToolResult) -> str:
    """An MCP tool result as the text the model reads."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        elif isinstance(block, types.ImageContent | types.AudioContent):
            parts.append(f"[{block.type}: {block.mime_type}, not shown]")
        else:
            parts.append(json.dumps(block.model_dump(mode="json", exclude_none=True), ensure_ascii=False))
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


class McpServer:
    """One configured MCP server, its connection held by one task."""

    def __init__(
        self,
        name: str,
        config: McpServerConfig,
        *,
        backoff: float = 0.5,
        backoff_max: float = 30.0,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        self.name = name
        self.config = config
        self.state: McpState = "connecting"
        self.error: str | None = None
        self.tools: list[ExternalTool] = []
        self.connects = 0
        self._backoff = backoff
        self._backoff_max = backoff_max
        self._connect_timeout = connect_timeout
        self._scope: anyio.CancelScope | None = None
        self._client: Client | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        # Set in the stdio server's environment, to find its process group among this process's children.
        self._marker = f"{name}-{secrets.token_hex(8)}"

    # --- the holder task ------------------------------------------------------------------------------

    def start(self) -> None:
        self._scope = anyio.CancelScope()
        self._task = asyncio.create_task(self._hold(self._scope), name=f"mcp:{self.name}")

    async def stop(self) -> None:
        """Ends the holder task through its anyio cancel scope, which the SDK's shielded shutdown of a
        stdio server respects (stdin closed, a grace period, then its process group killed). A native
        `task.cancel()` would cut that shutdown short and leave the server and its children running, so
        it is only the last resort, after `_STOP_FORCE` seconds. anyio keeps cancelling inside the scope,
        so a cancel the SDK turns into an error on its way out does not keep the holder alive."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping = True
        if self._scope is not None:
            self._scope.cancel()
        if not (await asyncio.wait({task}, timeout=_STOP_FORCE))[0]:
            logger.warning("MCP server %r: its holder outlived a cancel; cancelling the task", self.name)
            while not (await asyncio.wait({task}, timeout=_STOP_RECANCEL))[0]:
                task.cancel()
        if not task.cancelled() and task.exception() is not None:
            logger.warning("MCP server %r: its holder ended with %r", self.name, task.exception())

    async def _hold(self, scope: anyio.CancelScope) -> None:
        delay = self._backoff
        with scope:
            while not self._stopping:
                if self.state != "error":
                    self.state = "connecting"
                connects = self.connects
                try:
                    await self._connect_and_watch()
                except Exception as exc:
                    if self._stopping:
                        return  # a cancel the SDK turned into an error
                    reason = _reason(exc)
                    # Once per new reason: a server that stays down does not fill the log every backoff.
                    level = (
                        logging.DEBUG if (self.state, self.error) == ("error", reason) else logging.WARNING
                    )
                    if self.connects != connects:
                        delay = self._backoff  # it was connected: the backoff starts again
                    self.state, self.error = "error", reason
                    logger.log(level, "MCP server %r: %s; retrying in %.1f s", self.name, reason, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._backoff_max)

    async def _connect_and_watch(self) -> None:
        """One connection: connected within the connect timeout (the handshake and the first tool list),
        then watched until it ends. Raises why it ended."""
        group: int | None = None
        marker = None if self.config.command is None else self._marker
        timeout = self._connect_timeout
        # An anyio scope, not asyncio.timeout: its cancel leaves the SDK's shielded shutdown whole.
        connecting = anyio.CancelScope(deadline=anyio.current_time() + timeout)
        try:
            with connecting:
                async with AsyncExitStack() as stack:
                    client = await stack.enter_async_context(self._client_for(stack))
                    self._client = client
                    if marker is not None:
                        group = find_group(marker)
                    await self._refresh(client)
                    connecting.deadline = math.inf
                    self.state, self.error = "connected", None
                    self.connects += 1
                    logger.info("MCP server %r connected: %d tools", self.name, len(self.tools))
                    await self._watch(client)
            if not connecting.cancel_called:
                raise ConnectionError("the connection ended")
        except Exception as exc:
            if not connecting.cancel_called or self._stopping:
                raise
            raise TimeoutError(f"no answer to the handshake within {timeout:g} s") from exc
        else:
            if not self._stopping:
                raise TimeoutError(f"no answer to the handshake within {timeout:g} s")
        finally:
            self._client = None
            self.tools = []
            # The SDK kills the group only when the server outlives its stdin; a server that died
            # leaves its children behind. They go with their group here.
            if group is not None:
                kill_group(group)

    def _client_for(self, stack: AsyncExitStack) -> Client:
        config = self.config
        target: StdioServerParameters | Any
        if config.url is not None:
            http = httpx2.AsyncClient(
                headers=config.headers, timeout=httpx2.Timeout(30.0, read=300.0), follow_redirects=False
            )
            stack.push_async_callback(http.aclose)
            target = streamable_http_client(config.url, http_client=http)
        else:
            assert config.command is not None
            env = {**config.env, MARKER_VARIABLE: self._marker}
            target = StdioServerParameters(command=config.command, args=config.args, env=env, cwd=config.cwd)
        return Client(target, client_info=_CLIENT_INFO, message_handler=self._on_message)

    async def _on_message(self, message: Any) -> None:
        """Notifications of servers that predate `subscriptions/listen`."""
        if isinstance(message, types.ToolListChangedNotification):
            self._changed.set()

    async def _watch(self, client: Client) -> None:
        """Returns (or raises) when the connection is gone; refetches the tools when they change."""
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _ in subscription:
                    await self._refresh(client)
            return
        except ListenNotSupportedError:
            pass
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_PING_INTERVAL):
                    await self._changed.wait()
            if self._changed.is_set():
                self._changed.clear()
                await self._refresh(client)
            else:
                async with asyncio.timeout(self.config.timeout):
                    await client.send_ping()

    async def _refresh(self, client: Client) -> None:
        listed: list[types.Tool] = []
        cursor: str | None = None
        async with asyncio.timeout(self.config.timeout):
            for _ in range(100):
                page = await client.list_tools(cursor=cursor, cache_mode="refresh")
                listed.extend(page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    break
        self.tools = [self._tool(tool) for tool in listed]

    # --- the tools ------------------------------------------------------------------------------------

    def _tool(self, tool: types.Tool) -> ExternalTool:
        remote = tool.name
        name = clean_name(f"{self.name}__{remote}")

        async def call(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
            return await self.call(remote, arguments, ctx)

        schema = dict(tool.input_schema) if tool.input_schema else {"type": "object", "properties": {}}
        return ExternalTool(
            name=name,
            description=tool.description or tool.title or remote,
            parameters=schema,
            source="mcp",
            call=call,
            timeout=self.config.timeout,
            requires_approval=self._needs_approval(remote, name),
            group=self.name,
            remote_name=remote,
        )

    def _needs_approval(self, remote: str, name: str) -> bool:
        approval = self.config.approval
        if isinstance(approval, str):
            return approval == "always"
        return any(fnmatch.fnmatchcase(remote, p) or fnmatch.fnmatchcase(name, p) for p in approval)

    async def call(self, remote: str, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
        """One tools/call from the caller's task; cancelling that task cancels the call at the server."""
        client = self._client
        if client is None:
            why = f": {self.error}" if self.error else ""
            return ToolOutcome(f"MCP server '{self.name}' is not connected{why}", is_error=True)
        try:
            # No read timeout of the SDK's: the registry's deadline (the server's `timeout`) cancels the call.
            result = await client.call_tool(remote, arguments)
        except MCPError as exc:
            return ToolOutcome(
                f"MCP server '{self.name}' could not answer the call: {exc.error.message}", is_error=True
            )
        except Exception as exc:
            logger.warning(
                "MCP call %s on %r failed (call %s)", remote, self.name, ctx.tool_call_id, exc_info=exc
            )
            return ToolOutcome(
                f"MCP server '{self.name}' failed during the call ({_reason(exc)}); the server may be down",
                is_error=True,
            )
        text, truncated = cap_result(result_text(result), self.config.max_result_chars)
        return ToolOutcome(text, is_error=bool(result.is_error), truncated=truncated)


class McpServers:
    """Every MCP server of the tools file: a `ToolProvider` for the registry."""

    def __init__(
        self,
        configs: dict[str, McpServerConfig],
        *,
        backoff: float = 0.5,
        backoff_max: float = 30.0,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        self.servers = {
            name: McpServer(
                name, config, backoff=backoff, backoff_max=backoff_max, connect_timeout=connect_timeout
            )
            for name, config in configs.items()
        }

    def start(self) -> None:
        for server in self.servers.values():
            server.start()

    async def stop(self) -> None:
        """Ends every holder task; each leaves its client, which kills its stdio server's process group."""
        await asyncio.gather(*(server.stop() for server in self.servers.values()))

    def tools(self) -> Sequence[ExternalTool]:
        return [tool for server in self.servers.values() for tool in server.tools]

    def groups(self) -> Collection[str]:
        return self.servers.keys()
