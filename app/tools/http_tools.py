"""HTTP tools: an operator's HTTPS endpoint as a tool (`HttpTools`, a `ToolProvider`).

This module owns the call: the model's arguments (already checked against the tool's JSON schema by
the registry) are POSTed as JSON with

* `X-Parley-Tool-Call-Id`: the call's id, the receiver's idempotency key (a retried call has the same);
* `X-Parley-Timestamp`: Unix seconds; and `X-Parley-Signature: sha256=<hex>`, the HMAC-SHA256 with the
  tool's `secret` of `<timestamp>.<body>`, so the receiver knows the request is Parley's and recent.

No redirect is followed (a 3xx is an error result), the response is read up to the tool's
`max_response_bytes` (then cut, with a marker) within its `timeout`, and a 2xx body is the result; any
other status, or a failure, is an error result with the reason.

SSRF: the host is resolved by `VettingResolver` and the connection goes to the addresses it vetted:
loopback, private, link-local (the cloud metadata address among them), multicast, reserved and
unspecified addresses are refused unless the tools file names the host in `allow_private_hosts`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import socket
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from app.tools.config import HttpToolConfig
from app.tools.context import ToolContext, ToolOutcome
from app.tools.external import ExternalTool, cap_result

__all__ = ["HttpTools", "SsrfRefused", "VettingResolver", "refusal", "sign"]

Resolve = Callable[[str, int], Awaitable[list[str]]]
_IP = ipaddress.IPv4Address | ipaddress.IPv6Address


class SsrfRefused(OSError):
    """The tool's host is, or resolves to, an address tools may not reach."""


def refusal(address: _IP) -> str | None:
    """Why tools may not reach this address, or None."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for check, why in (
        ("is_loopback", "loopback"),
        ("is_link_local", "link-local (cloud metadata)"),
        ("is_private", "private"),
        ("is_multicast", "multicast"),
        ("is_reserved", "reserved"),
        ("is_unspecified", "unspecified"),
    ):
        if getattr(address, check):
            return why
    return None


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The `X-Parley-Signature` value of a request."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


async def _system_resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class VettingResolver(AbstractResolver):
    """aiohttp's resolver for HTTP tools: the addresses a host resolves to, each vetted first."""

    def __init__(self, allowed_hosts: Collection[str], resolve: Resolve = _system_resolve) -> None:
        self._allowed = {host.lower() for host in allowed_hosts}
        self._resolve = resolve

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[ResolveResult]:
        addresses = await self._resolve(host, port)
        if not addresses:
            raise SsrfRefused(f"{host} does not resolve")
        results: list[ResolveResult] = []
        for text in addresses:
            address = ipaddress.ip_address(text.split("%", 1)[0])
            why = refusal(address)
            if why is not None and host.lower() not in self._allowed:
                raise SsrfRefused(f"{host} resolves to a {why} address, which tools may not reach")
            family_ = socket.AF_INET6 if address.version == 6 else socket.AF_INET
            results.append(
                ResolveResult(hostname=host, host=str(address), port=port, family=family_, proto=0, flags=0)
            )
        return results

    async def close(self) -> None:
        pass


async def _read_body(stream: aiohttp.StreamReader, limit: int) -> bytes:
    """The body up to `limit` bytes, however many pieces it arrives in: one `read(n)` returns only what
    has arrived, so it is called until the body ends or the limit is reached."""
    data = bytearray()
    while len(data) < limit:
        piece = await stream.read(limit - len(data))
        if not piece:
            break
        data += piece
    return bytes(data)


class HttpTools:
    """The tools file's HTTP tools, sharing one connection pool that connects only to vetted addresses."""

    def __init__(
        self,
        configs: dict[str, HttpToolConfig],
        allowed_hosts: Sequence[str] = (),
        *,
        resolve: Resolve = _system_resolve,
    ) -> None:
        self._configs = configs
        self._allowed = {host.lower() for host in allowed_hosts}
        self._resolve = resolve
        self._session: aiohttp.ClientSession | None = None
        self._tools = [self._tool(name, config) for name, config in configs.items()]

    def start(self) -> None:
        connector = aiohttp.TCPConnector(resolver=VettingResolver(self._allowed, self._resolve))
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=True, trust_env=False)

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def tools(self) -> Sequence[ExternalTool]:
        return self._tools

    def groups(self) -> Collection[str]:
        return ()

    def _tool(self, name: str, config: HttpToolConfig) -> ExternalTool:
        async def call(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
            return await self.call(name, config, arguments, ctx)

        return ExternalTool(
            name=name,
            description=config.description,
            parameters=config.parameters,
            source="http",
            call=call,
            timeout=config.timeout,
            requires_approval=config.approval == "always",
        )

    def _check_literal(self, url: str) -> None:
        """An IP literal never reaches the resolver: it is vetted here."""
        host = (urlsplit(url).hostname or "").lower()
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return
        why = refusal(address)
        if why is not None and host not in self._allowed:
            raise SsrfRefused(f"{host} is a {why} address, which tools may not reach")

    async def call(
        self, name: str, config: HttpToolConfig, arguments: dict[str, Any], ctx: ToolContext
    ) -> ToolOutcome:
        if self._session is None:
            return ToolOutcome(
                f"HTTP tool '{name}' is not available (the service is stopping)", is_error=True
            )
        body = json.dumps(arguments, ensure_ascii=False, separators=(",", ":")).encode()
        timestamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "X-Parley-Tool-Call-Id": ctx.tool_call_id,
            "X-Parley-Timestamp": timestamp,
            "X-Parley-Signature": sign(config.secret, timestamp, body),
        }
        answered = False
        try:
            self._check_literal(config.url)
            async with self._session.post(
                config.url,
                data=body,
                headers=headers,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=config.timeout),
            ) as response:
                answered = True
                data = await _read_body(response.content, config.max_response_bytes + 1)
                status = response.status
        except TimeoutError:
            # What came before the tool's timeout is not the answer: the model is told it has none.
            what = "the response did not end" if answered else "no response"
            return ToolOutcome(
                f"HTTP tool '{name}' timed out after {float(config.timeout)} s ({what})", is_error=True
            )
        except SsrfRefused as exc:
            return ToolOutcome(f"HTTP tool '{name}' refused: {exc}", is_error=True)
        except (aiohttp.ClientError, OSError) as exc:
            cause = exc.__cause__ if isinstance(exc.__cause__, SsrfRefused) else exc
            detail = str(cause) if isinstance(cause, SsrfRefused) else type(exc).__name__
            return ToolOutcome(f"HTTP tool '{name}' failed: {detail}", is_error=True)
        text = data[: config.max_response_bytes].decode("utf-8", errors="replace")
        truncated = len(data) > config.max_response_bytes
        if truncated:
            text += f"\n[truncated: the response was longer than {config.max_response_bytes} bytes]"
        if 300 <= status < 400:
            return ToolOutcome(
                f"HTTP tool '{name}' answered a redirect ({status}): not followed", is_error=True
            )
        if status >= 400:
            text, cut = cap_result(text, 2000)
            return ToolOutcome(f"HTTP tool '{name}' answered {status}: {text}", is_error=True, truncated=cut)
        return ToolOutcome(text, is_error=False, truncated=truncated)
