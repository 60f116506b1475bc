"""The lean stream reader for OpenAI-compatible providers: one pooled aiohttp session, the SSE parsed here.

LiteLLM still resolves the model, key, base URL and parameters (routing.py); this module only sends the
request and reads the stream. The transport is aiohttp (already LiteLLM's own default transport): its C
HTTP parser and plain asyncio protocol read a paced chunk for ~25 µs of CPU, where httpx (pure-Python
h11 under anyio) took ~85 and LiteLLM's wrapper ~600 (measured on a 2-core
machine, 100 streams of 100 chunks at 20 ms). Failures become the `ProviderError`s LiteLLMAdapter would
give for the same upstream behaviour (provider_errors.py); the upstream's own words go to the log only.

A success status is not taken on trust: the body's opening must read as SSE (an HTML page, an empty body
or JSON is `provider_bad_response`), and the stream must end with a finish_reason or `[DONE]` (else
`provider_stream_interrupted`); a read that waits longer than the timeout is `provider_timeout`, mid-stream
as before the headers. Both checks run once per stream, at its start and its end, never per chunk.

Closing or cancelling the stream closes the HTTP response at once: an unfinished response never goes
back to the pool, its connection is closed, so the upstream sees the disconnect within milliseconds.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import functools
import json
import logging
import urllib.parse
import urllib.request
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from aiohttp.helpers import proxies_from_env

from app.llm.provider_errors import ended_unfinished, from_status, not_a_stream, provider_error
from app.llm.routing import Endpoint
from app.llm.types import (
    FinishPart,
    ModelRequest,
    ProviderError,
    ReasoningPart,
    StreamPart,
    TextPart,
    ToolCallPart,
    UsagePart,
)

log = logging.getLogger(__name__)

USER_AGENT = "parley"
_ERROR_BODY_LIMIT = 64 * 1024
_LOGGED_CHARS = 2000
# After [DONE] only the end of the chunked body should follow; reading it lets the connection be reused.
_DRAIN_SECONDS = 0.25
_MAX_LINE = 4 * 1024 * 1024  # one event; a stream that never ends its line is not a chat completion
# The body's opening, read before any of it is parsed: up to its first line that is neither blank nor a
# comment (the first event's, in a stream), or this many bytes. An HTML page shows itself within it.
_OPENING = 1024
_SHOWN = 200  # of the opening, at most this many bytes in a log line
_SSE_FIELDS = frozenset({b"data", b"event", b"id", b"retry"})


def new_http_client() -> aiohttp.ClientSession:
    """The pool the lean reader shares (create it on the loop that uses it): no cap on connections, each
    stream holds one for its duration; proxies from the environment (`env_proxy`), as httpx and the
    openai SDK do."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=30),
        headers={"user-agent": USER_AGENT, "accept-encoding": "identity"},
        # Not aiohttp's trust_env: it looks the proxy up again for every request, and ~/.netrc too, each
        # in a thread of the default executor (measured: 5% of a turn's CPU, two thread hops before each
        # request is sent), and credentials it found in ~/.netrc for the provider's host would make every
        # request fail beside the key's Authorization header.
        trust_env=False,
        # The body is read as it comes; nothing may buffer or inflate it on the way.
        auto_decompress=False,
        raise_for_status=False,
    )


@dataclass(frozen=True)
class EnvProxy:
    """Where a provider URL's requests go per the environment: `url` None means straight to the host."""

    url: str | None = None
    # The proxy's login as a Proxy-Authorization header: in the CONNECT request for an https target
    # (`connect_headers`), in the request itself for an http one (`headers`), which goes to the proxy.
    connect_headers: dict[str, str] | None = None
    headers: dict[str, str] | None = None


@functools.lru_cache(maxsize=64)
def env_proxy(url: str) -> EnvProxy:
    """The proxy the environment names for `url` and its login, as aiohttp's trust_env finds them
    (HTTP_PROXY / HTTPS_PROXY by scheme, NO_PROXY, the login from the proxy's URL or ~/.netrc): looked up
    once per provider URL, since the environment does not change under a running server."""
    parts = urllib.parse.urlsplit(url)
    if parts.hostname is not None and urllib.request.proxy_bypass(parts.hostname):
        return EnvProxy()
    found = proxies_from_env().get(parts.scheme)
    if found is None:
        return EnvProxy()
    if found.proxy_auth is None:
        return EnvProxy(str(found.proxy))
    login = {"Proxy-Authorization": found.proxy_auth.encode()}
    if parts.scheme == "https":
        return EnvProxy(str(found.proxy), connect_headers=login)
    return EnvProxy(str(found.proxy), headers=login)


class Target(Protocol):
    """What the log lines and errors below name of a stream's upstream: its URL and model (an `Endpoint`,
    or the Anthropic reader's own, anthropic.py, which shares this module's transport and checks)."""

    @property
    def url(self) -> str: ...

    @property
    def model(self) -> str: ...


class OpenAICompatAdapter:
    def __init__(self, client: aiohttp.ClientSession, endpoint: Endpoint) -> None:
        self._client = client
        self._endpoint = endpoint

    @property
    def endpoint(self) -> Endpoint:
        return self._endpoint

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamPart, None]:
        endpoint = self._endpoint
        response = await self._send(request)
        reusable = False
        try:
            if response.status >= 300:
                raise await _status_error(response, endpoint)
            sse = SSEReader(endpoint.finish_reason)
            chunks = response.content.iter_any()
            try:
                opening, ended = await _opening(chunks)
                _check_opening(opening, ended, response, endpoint)
                for part in sse.feed(opening):
                    yield part
                if not ended and not sse.done:
                    async for data in chunks:
                        parts = sse.feed(data)
                        for part in parts:
                            yield part
                        if sse.done:
                            break
                if sse.done:
                    reusable = await _drained(chunks)
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise _read_failed(exc, endpoint, request.timeout) from exc
            if not sse.done and not sse.finished:
                raise _ended_unfinished(opening, response, endpoint)
            yield sse.finish()
        finally:
            if reusable:
                response.release()  # read to its end: the connection goes back to the pool
            else:
                # Cut short (a stop, an error, a body that did not end): the connection is closed now,
                # so the upstream sees the client go and stops generating.
                response.close()

    async def _send(self, request: ModelRequest) -> aiohttp.ClientResponse:
        """The request, up to the answer's headers."""
        endpoint = self._endpoint
        if endpoint.api_key is None:
            raise provider_error("provider_auth_missing")
        body = endpoint.prepare(request.messages, request.tools)
        # Per read, like LiteLLM's `timeout=`: connecting, the headers, then every gap between chunks.
        timeout = aiohttp.ClientTimeout(total=None, connect=request.timeout, sock_read=request.timeout)
        proxy = env_proxy(endpoint.url)
        try:
            return await self._client.post(
                endpoint.url,
                data=json.dumps(body, separators=(",", ":")).encode(),
                headers={**endpoint.headers, **proxy.headers} if proxy.headers else endpoint.headers,
                timeout=timeout,
                proxy=proxy.url,
                proxy_headers=proxy.connect_headers,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _before_response(exc, endpoint) from exc


async def _drained(chunks: AsyncIterator[bytes]) -> bool:
    """Reads what follows [DONE] (only the end of the chunked body should): whether the body ended, so
    the connection can be reused."""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with asyncio.timeout(_DRAIN_SECONDS):
            async for _ in chunks:
                pass
            return True
    return False


def _read_failed(exc: aiohttp.ClientError | TimeoutError, endpoint: Target, timeout: float) -> ProviderError:
    """A read of the body that failed: one that waited longer than `timeout` (aiohttp's read timeout is a
    TimeoutError too), or a connection that broke."""
    if isinstance(exc, TimeoutError):
        log.warning("the stream of %s stalled: no byte for %s s", endpoint.model, timeout)
        return provider_error("provider_timeout")
    log.warning("the stream of %s broke off: %r", endpoint.model, exc)
    return provider_error("provider_stream_interrupted")


def _ended_unfinished(opening: bytes, response: aiohttp.ClientResponse, endpoint: Target) -> ProviderError:
    log.warning(
        "the stream of %s from %s ended with neither a finish_reason nor [DONE] (HTTP %s, %s): it began %r",
        endpoint.model,
        endpoint.url,
        response.status,
        response.headers.get("content-type"),
        opening[:_SHOWN],
    )
    return ended_unfinished()


async def _opening(chunks: AsyncIterator[bytes]) -> tuple[bytes, bool]:
    """The body's first bytes, read until they show what the body is (see `_OPENING`); and whether the
    body ended there."""
    opening = b""
    async for data in chunks:
        opening += data
        if len(opening) >= _OPENING or _first_line(opening, whole=False) is not None:
            return opening, False
    return opening, True


def _first_line(opening: bytes, *, whole: bool) -> bytes | None:
    """The opening's first line that is neither blank nor a comment; its unfinished last line counts only
    when `whole`."""
    lines = opening.removeprefix(codecs.BOM_UTF8).split(b"\n")
    if not whole:
        lines.pop()
    for line in lines:
        line = line.strip()
        if line and not line.startswith(b":"):
            return line
    return None


def _check_opening(opening: bytes, ended: bool, response: aiohttp.ClientResponse, endpoint: Target) -> None:
    """Raises `provider_bad_response` unless the opening reads as SSE: its first line a field of one, or
    only comments so far. Judged on the body, not the Content-Type: a stream labelled otherwise is read."""
    line = _first_line(opening, whole=ended or len(opening) >= _OPENING)
    if line is None and not ended:
        return  # comments only (a provider keeping the connection alive): the stream goes on
    if line is not None and line.split(b":", 1)[0] in _SSE_FIELDS:
        return
    content_type = response.headers.get("content-type")
    log.warning(
        "%s answered HTTP %s with %s for %s, not a completion stream: %r",
        endpoint.url,
        response.status,
        content_type or "no content type",
        endpoint.model,
        opening[:_SHOWN],
    )
    raise not_a_stream(
        content_type,
        empty=not opening.strip(),
        html=line is not None and line.startswith(b"<"),
        status=response.status,
    )


class SSEReader:
    """Server-sent events from an OpenAI-compatible stream, fed bytes as they arrive, turned into parts.

    Each `data:` line is one event (OpenAI and vLLM send one line per event); blank lines, `:` comments
    and other fields are skipped; `[DONE]` ends the stream. A line may arrive in any number of pieces.
    """

    __slots__ = ("_finish", "_map_finish", "_tail", "_tool_called", "done")

    def __init__(self, map_finish: Callable[[str], str]) -> None:
        self._map_finish = map_finish
        self._tail = b""
        self._finish: str | None = None
        self._tool_called = False
        self.done = False

    def feed(self, data: bytes) -> list[StreamPart]:
        if self._tail:
            data = self._tail + data
        lines = data.split(b"\n")
        self._tail = lines.pop()
        if len(self._tail) > _MAX_LINE:
            log.warning("the provider sent a line of more than %d bytes", _MAX_LINE)
            raise provider_error("provider_stream_interrupted")
        parts: list[StreamPart] = []
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                break
            if payload:
                self._event(payload, parts)
        return parts

    @property
    def finished(self) -> bool:
        """Whether the provider sent a finish_reason (read once, at the stream's end)."""
        return self._finish is not None

    def finish(self) -> FinishPart:
        """The finish reason, once the stream is over: as LiteLLM reports it ("stop" with tool calls is
        "tool_calls"; none at all is "stop")."""
        reason = self._map_finish(self._finish) if self._finish else "stop"
        if reason == "stop" and self._tool_called:
            reason = "tool_calls"
        return FinishPart(reason)

    def _event(self, payload: bytes, parts: list[StreamPart]) -> None:
        try:
            event = json.loads(payload)
            if event.get("error") is not None:
                log.warning("the provider sent an error mid-stream: %s", _head(payload))
                raise provider_error("provider_stream_interrupted")
            choices = event.get("choices")
            if choices:
                self._choice(choices[0], parts)
            usage = event.get("usage")
            if usage:
                parts.append(_usage(usage))
        except (ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
            log.warning("the provider sent an event that is not a chat completion chunk: %s", _head(payload))
            raise provider_error("provider_stream_interrupted") from exc

    def _choice(self, choice: dict[str, Any], parts: list[StreamPart]) -> None:
        delta = choice.get("delta")
        if delta:
            # DeepSeek and Qwen (and vLLM for them) stream reasoning as `reasoning_content`, others
            # (OpenRouter, vLLM's newer releases) as `reasoning`: shown, never sent back.
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning and isinstance(reasoning, str):
                parts.append(ReasoningPart(reasoning))
            content = delta.get("content")
            if content:
                parts.append(TextPart(content))
            calls = delta.get("tool_calls")
            if calls:
                self._tool_called = True
                for call in calls:
                    function = call.get("function") or {}
                    parts.append(
                        ToolCallPart(
                            index=call.get("index") or 0,
                            id=call.get("id"),
                            name=function.get("name"),
                            arguments=function.get("arguments") or "",
                        )
                    )
        reason = choice.get("finish_reason")
        if reason:
            self._finish = reason


def _usage(usage: dict[str, Any]) -> UsagePart:
    """OpenAI's usage object: the cached part of the prompt (`prompt_tokens_details.cached_tokens`) and the
    reasoning part of the completion (`completion_tokens_details.reasoning_tokens`) where reported."""
    prompt_details = usage.get("prompt_tokens_details") or {}
    completion_details = usage.get("completion_tokens_details") or {}
    reasoning = completion_details.get("reasoning_tokens")
    return UsagePart(
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        total_tokens=int(usage.get("total_tokens") or 0),
        cache_read_tokens=int(prompt_details.get("cached_tokens") or 0),
        reasoning_tokens=int(reasoning) if reasoning is not None else None,
    )


def _head(payload: bytes | str) -> str:
    text = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload
    return text[:_LOGGED_CHARS]


def _before_response(exc: BaseException, endpoint: Target) -> ProviderError:
    """No answer at all: a timeout (connect, or no headers in time) or a connection that failed."""
    log.warning("calling %s at %s failed: %r", endpoint.model, endpoint.url, exc)
    if isinstance(exc, TimeoutError):
        return provider_error("provider_timeout")
    return provider_error("provider_unreachable")


async def _status_error(response: aiohttp.ClientResponse, endpoint: Target) -> ProviderError:
    return from_status(response.status, await _error_text(response, endpoint), response.headers)


async def _error_text(response: aiohttp.ClientResponse, endpoint: Target) -> str:
    """The body of an error answer (its first 64 KiB), logged."""
    received = bytearray()
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async for data in response.content.iter_any():
            received += data
            if len(received) >= _ERROR_BODY_LIMIT:
                break
    text = received[:_ERROR_BODY_LIMIT].decode("utf-8", "replace")
    log.warning("%s answered HTTP %s for %s: %s", endpoint.url, response.status, endpoint.model, _head(text))
    return text
