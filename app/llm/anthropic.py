"""The native reader for Anthropic's Messages API: the request mapped here, the event stream parsed here.

Models whose provider is Anthropic (`anthropic/...`, as LiteLLM routes them) come here instead of
LiteLLM's child process (gateway.py). The transport, its timeouts per read, the check of the body's
opening (an HTML page with status 200 is `provider_bad_response`) and the fast close on a stop are the
OpenAI-compatible reader's (openai_compat.py); failures are the same `ProviderError` codes.

The request: the OpenAI-format history the turn keeps becomes Anthropic's, with the system prompt as
`system`, roles alternating from a user message (tool results are user turns; consecutive messages of one
role merged), tools as `input_schema`s, and `max_tokens` (which Anthropic requires): the models file's
`max_output_tokens`, else the model's known maximum output, else 4096. With prompt caching on (the
default; `"prompt_cache": false` in the models file turns it off, docs/configuration.md) an ephemeral
`cache_control` breakpoint marks the system prompt, the last tool and the last message before the new
user turn, so the next call reads that prefix from the cache.

The stream (https://docs.anthropic.com/en/docs/build-with-claude/streaming): `message_start` (input usage),
`content_block_start/delta/stop` (text, tool_use with its input as streamed JSON, thinking with its
signature and redacted thinking as ReasoningParts), `message_delta` (stop reason, output usage),
`message_stop`, `ping`, and `error` mid-stream. A stream that ends before `message_stop` was cut short.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from app.llm.litellm_tables import ModelMap
from app.llm.openai_compat import (
    _before_response,
    _check_opening,
    _drained,
    _error_text,
    _head,
    _opening,
    _read_failed,
    env_proxy,
)
from app.llm.provider_errors import ended_unfinished, from_status, provider_error, retry_after_of
from app.llm.types import (
    FinishPart,
    ModelRequest,
    ProviderError,
    ReasoningPart,
    ResolvedModel,
    StreamPart,
    TextPart,
    ToolCallPart,
    UsagePart,
)

log = logging.getLogger(__name__)

API_VERSION = "2023-06-01"
DEFAULT_BASE = "https://api.anthropic.com"
DEFAULT_MAX_TOKENS = 4096
KEY_VARIABLE = "ANTHROPIC_API_KEY"
_EPHEMERAL = {"type": "ephemeral"}
_SHOWN = 200
_MAX_LINE = 4 * 1024 * 1024
# Anthropic's stop reasons as the finish reasons the rest of Parley knows (LiteLLM's mapping).
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}
_CONTEXT_MARKERS = ("prompt is too long", "exceed context limit", "context window")


@dataclass(frozen=True, slots=True)
class AnthropicEndpoint:
    """One Anthropic model: `url` the Messages endpoint, `model` its bare name; `api_key` None: none set."""

    url: str
    model: str
    api_key: str | None = field(repr=False)
    max_tokens: int = DEFAULT_MAX_TOKENS
    prompt_cache: bool = True
    # Extended thinking's budget (the models file's `reasoning.budget_tokens`); None: no thinking.
    thinking_budget: int | None = None


def messages_url(api_base: str | None) -> str:
    """The Messages endpoint under a base URL (the models file's, else ANTHROPIC_BASE_URL or
    ANTHROPIC_API_BASE, as the SDK and LiteLLM read them), `/v1/messages` appended unless there."""
    base = (
        api_base
        or os.environ.get("ANTHROPIC_BASE_URL")
        or os.environ.get("ANTHROPIC_API_BASE")
        or DEFAULT_BASE
    ).rstrip("/")
    return base if base.endswith("/v1/messages") else base + "/v1/messages"


def api_key(configured: str | None, key_env: str | None) -> str | None:
    """The models file's key; else, unless the entry names a key variable that is unset, ANTHROPIC_API_KEY."""
    if configured:
        return configured
    if key_env:
        return None
    return os.environ.get(KEY_VARIABLE) or None


# ----- the request ------------------------------------------------------------------------------------


def request_body(endpoint: AnthropicEndpoint, request: ModelRequest) -> dict[str, Any]:
    system, messages = convert_messages(request.messages)
    body: dict[str, Any] = {
        "model": endpoint.model,
        "max_tokens": endpoint.max_tokens,
        "messages": messages,
        "stream": True,
    }
    if endpoint.thinking_budget is not None:
        body["thinking"] = {"type": "enabled", "budget_tokens": endpoint.thinking_budget}
        # max_tokens counts the thinking too and must exceed its budget: room for an answer after it.
        if endpoint.max_tokens <= endpoint.thinking_budget:
            body["max_tokens"] = endpoint.thinking_budget + DEFAULT_MAX_TOKENS
    if system:
        body["system"] = [{"type": "text", "text": text} for text in system]
    tools = [convert_tool(tool) for tool in request.tools]
    if tools:
        body["tools"] = tools
    if endpoint.prompt_cache:
        add_cache_breakpoints(body)
    return body


def add_cache_breakpoints(body: dict[str, Any]) -> None:
    """Ephemeral breakpoints on the system prompt, the last tool and the last message before the new user
    turn (three of the four Anthropic allows): each marks the prefix up to it as one to cache."""
    if body.get("system"):
        body["system"][-1]["cache_control"] = dict(_EPHEMERAL)
    if body.get("tools"):
        body["tools"][-1]["cache_control"] = dict(_EPHEMERAL)
    messages = body["messages"]
    if len(messages) >= 2 and messages[-1]["role"] == "user" and messages[-2]["content"]:
        messages[-2]["content"][-1]["cache_control"] = dict(_EPHEMERAL)


def convert_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI function tool as Anthropic's tool definition."""
    function = tool.get("function") or tool
    converted: dict[str, Any] = {
        "name": function["name"],
        "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
    }
    if function.get("description"):
        converted["description"] = function["description"]
    return converted


def convert_messages(messages: Sequence[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """The system texts, and the history as Anthropic's alternating messages of content blocks."""
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            system += [block["text"] for block in _text_blocks(message.get("content"))]
            continue
        if role == "assistant":
            # The response's thinking first, as it came (a tool round requires it signed, before the
            # tool_use); then its text and its calls.
            blocks = (
                _thinking_blocks(message.get("thinking_blocks"))
                + _text_blocks(message.get("content"))
                + _tool_uses(message.get("tool_calls") or [])
            )
        elif role == "tool":
            blocks = [_tool_result(message)]
            role = "user"
        else:
            blocks = _user_blocks(message.get("content"))
            role = "user"
        if not blocks:
            continue  # Anthropic refuses an empty message; leaving it out keeps the roles alternating
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return system, out


def _text_blocks(content: Any) -> list[dict[str, Any]]:
    """Text content as text blocks, blank ones left out (Anthropic refuses empty text blocks)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content.strip() else []
    blocks: list[dict[str, Any]] = []
    for part in content or []:
        if isinstance(part, dict) and part.get("type") == "text" and str(part.get("text") or "").strip():
            blocks.append({"type": "text", "text": part["text"]})
    return blocks


def _thinking_blocks(blocks: Any) -> list[dict[str, Any]]:
    """The signed thinking and redacted thinking blocks an assistant message kept (LiteLLM's
    `thinking_blocks`); a thinking block without its signature cannot go back and is left out."""
    out: list[dict[str, Any]] = []
    for block in blocks or []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "thinking" and block.get("signature"):
            out.append(
                {"type": "thinking", "thinking": block.get("thinking") or "", "signature": block["signature"]}
            )
        elif block.get("type") == "redacted_thinking" and block.get("data"):
            out.append({"type": "redacted_thinking", "data": block["data"]})
    return out


def _user_blocks(content: Any) -> list[dict[str, Any]]:
    if not isinstance(content, list):
        return _text_blocks(content)
    blocks: list[dict[str, Any]] = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "image_url":
            blocks.append(_image(part.get("image_url")))
        elif isinstance(part, dict) and part.get("type") == "file":
            blocks.append(_document(part.get("file")))
        else:
            blocks += _text_blocks([part])
    return blocks


def _image(image: Any) -> dict[str, Any]:
    url = str(image.get("url") if isinstance(image, dict) else image or "")
    if url.startswith("data:") and ";base64," in url:
        media, data = url[5:].split(";base64,", 1)
        return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _document(file: Any) -> dict[str, Any]:
    """An OpenAI `file` part (a PDF's data URL, app/turns/attachments.py) as a document block."""
    file = file if isinstance(file, dict) else {}
    url = str(file.get("file_data") or "")
    media, _, data = url.removeprefix("data:").partition(";base64,")
    block: dict[str, Any] = {
        "type": "document",
        "source": {"type": "base64", "media_type": media, "data": data},
    }
    if file.get("filename"):
        block["title"] = str(file["filename"])
    return block


def _tool_uses(calls: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for call in calls:
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = None
        blocks.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": function.get("name") or "",
                # Anthropic takes only an object; arguments that were none (the tool's result said so) {}.
                "input": arguments if isinstance(arguments, dict) else {},
            }
        )
    return blocks


def _tool_result(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    text = content if isinstance(content, str) else "".join(b["text"] for b in _text_blocks(content))
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.get("tool_call_id")}
    if text.strip():  # an empty result is sent without content: an empty text block is refused
        block["content"] = text
    return block


# ----- the stream -------------------------------------------------------------------------------------


class AnthropicAdapter:
    def __init__(self, client: aiohttp.ClientSession, endpoint: AnthropicEndpoint) -> None:
        self._client = client
        self._endpoint = endpoint

    @property
    def endpoint(self) -> AnthropicEndpoint:
        return self._endpoint

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamPart, None]:
        endpoint = self._endpoint
        response = await self._send(request)
        reusable = False
        try:
            if response.status >= 300:
                raise await _status_error(response, endpoint)
            events = EventReader()
            chunks = response.content.iter_any()
            try:
                opening, ended = await _opening(chunks)
                _check_opening(opening, ended, response, endpoint)
                for part in events.feed(opening):
                    yield part
                events.check()
                if not ended and not events.done:
                    async for data in chunks:
                        for part in events.feed(data):
                            yield part
                        events.check()
                        if events.done:
                            break
                if events.done:
                    reusable = await _drained(chunks)
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise _read_failed(exc, endpoint, request.timeout) from exc
            if not events.done:
                log.warning(
                    "the stream of %s from %s ended before message_stop (HTTP %s): it began %r",
                    endpoint.model,
                    endpoint.url,
                    response.status,
                    opening[:_SHOWN],
                )
                raise ended_unfinished()
            yield events.usage()
            yield events.finish()
        finally:
            if reusable:
                response.release()
            else:
                response.close()  # cut short: the upstream sees the disconnect now

    async def _send(self, request: ModelRequest) -> aiohttp.ClientResponse:
        endpoint = self._endpoint
        if endpoint.api_key is None:
            raise provider_error("provider_auth_missing")
        body = request_body(endpoint, request)
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream",
            "x-api-key": endpoint.api_key,
            "anthropic-version": API_VERSION,
        }
        timeout = aiohttp.ClientTimeout(total=None, connect=request.timeout, sock_read=request.timeout)
        proxy = env_proxy(endpoint.url)
        try:
            return await self._client.post(
                endpoint.url,
                data=json.dumps(body, separators=(",", ":")).encode(),
                headers={**headers, **proxy.headers} if proxy.headers else headers,
                timeout=timeout,
                proxy=proxy.url,
                proxy_headers=proxy.connect_headers,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _before_response(exc, endpoint) from exc


async def _status_error(response: aiohttp.ClientResponse, endpoint: AnthropicEndpoint) -> ProviderError:
    """An HTTP error answer: Anthropic's overload (529) and its context-length wording first, then the
    classification both readers share."""
    text = await _error_text(response, endpoint)
    if response.status == 529 or "overloaded_error" in text:
        overloaded = provider_error("provider_unavailable", status=response.status)
        overloaded.retry_after = retry_after_of(response.headers)
        return overloaded
    lowered = text.lower()
    if response.status == 400 and any(marker in lowered for marker in _CONTEXT_MARKERS):
        return provider_error("context_window_exceeded", status=response.status)
    return from_status(response.status, text, response.headers)


class EventReader:
    """Anthropic's server-sent events, fed bytes as they arrive, turned into parts.

    Each event's `data:` line holds its JSON, whose `type` names it (the `event:` line says the same and is
    skipped). Tool-use blocks are numbered in their order for `ToolCallPart.index`.
    """

    __slots__ = (
        "_blocks",
        "_cache_read",
        "_cache_write",
        "_input",
        "_output",
        "_stop_reason",
        "_tail",
        "_tools",
        "done",
        "failure",
    )

    def __init__(self) -> None:
        self._tail = b""
        self._blocks: dict[int, list[Any]] = {}  # content index -> [tool index, JSON received] for tool_use
        self._tools = 0
        self._input = self._output = self._cache_read = self._cache_write = 0
        self._stop_reason: str | None = None
        self.done = False
        # A failure the stream reported (an `error` event, a line that is no event): raised by `check`
        # once the parts read before it have been given out.
        self.failure: ProviderError | None = None

    def feed(self, data: bytes) -> list[StreamPart]:
        if self._tail:
            data = self._tail + data
        lines = data.split(b"\n")
        self._tail = lines.pop()
        parts: list[StreamPart] = []
        if len(self._tail) > _MAX_LINE:
            log.warning("the provider sent a line of more than %d bytes", _MAX_LINE)
            self.failure = provider_error("provider_stream_interrupted")
        for line in lines:
            if not line.startswith(b"data:") or self.done or self.failure is not None:
                continue
            payload = line[5:].strip()
            if payload:
                try:
                    self._event(payload, parts)
                except ProviderError as exc:
                    self.failure = exc
        return parts

    def check(self) -> None:
        if self.failure is not None:
            raise self.failure

    def usage(self) -> UsagePart:
        """The response's usage: the prompt counts the cached tokens read and written too (its whole size)."""
        prompt = self._input + self._cache_read + self._cache_write
        return UsagePart(
            prompt_tokens=prompt,
            completion_tokens=self._output,
            total_tokens=prompt + self._output,
            cache_read_tokens=self._cache_read,
            cache_write_tokens=self._cache_write,
        )

    def finish(self) -> FinishPart:
        reason = _FINISH.get(self._stop_reason or "end_turn", self._stop_reason)
        if reason == "stop" and self._tools:
            reason = "tool_calls"
        return FinishPart(reason)

    def _event(self, payload: bytes, parts: list[StreamPart]) -> None:
        try:
            event = json.loads(payload)
            kind = event["type"]
            if kind == "content_block_delta":
                self._delta(event["index"], event["delta"], parts)
            elif kind == "content_block_start":
                self._start(event["index"], event["content_block"], parts)
            elif kind == "content_block_stop":
                self._stop(event["index"], parts)
            elif kind == "message_start":
                self._count(event["message"].get("usage") or {})
            elif kind == "message_delta":
                self._stop_reason = (event.get("delta") or {}).get("stop_reason") or self._stop_reason
                self._count(event.get("usage") or {})
            elif kind == "message_stop":
                self.done = True
            elif kind == "error":
                raise _stream_error(event.get("error") or {}, payload)
            # ping, and event types Anthropic may add: nothing to read
        except (ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
            log.warning("the provider sent an event that is not a Messages stream event: %s", _head(payload))
            raise provider_error("provider_stream_interrupted") from exc

    def _start(self, index: int, block: dict[str, Any], parts: list[StreamPart]) -> None:
        kind = block["type"]
        if kind == "text":
            if block.get("text"):
                parts.append(TextPart(block["text"]))
        elif kind == "tool_use":
            self._blocks[index] = [self._tools, False]
            parts.append(ToolCallPart(index=self._tools, id=block["id"], name=block["name"], arguments=""))
            self._tools += 1
        elif kind == "thinking":
            if block.get("thinking"):
                parts.append(ReasoningPart(block["thinking"]))
            if block.get("signature"):
                parts.append(ReasoningPart(signature=block["signature"]))
        elif kind == "redacted_thinking":
            parts.append(ReasoningPart(redacted=block["data"]))
        # server tools' blocks: not read

    def _delta(self, index: int, delta: dict[str, Any], parts: list[StreamPart]) -> None:
        kind = delta["type"]
        if kind == "text_delta":
            if delta["text"]:
                parts.append(TextPart(delta["text"]))
        elif kind == "input_json_delta":
            tool = self._blocks.get(index)
            if tool is not None and delta["partial_json"]:
                tool[1] = True
                parts.append(ToolCallPart(index=tool[0], id=None, name=None, arguments=delta["partial_json"]))
        elif kind == "thinking_delta":
            if delta["thinking"]:
                parts.append(ReasoningPart(delta["thinking"]))
        elif kind == "signature_delta":
            parts.append(ReasoningPart(signature=delta["signature"]))
        # citations: not read

    def _stop(self, index: int, parts: list[StreamPart]) -> None:
        tool = self._blocks.pop(index, None)
        if tool is not None and not tool[1]:  # a call without arguments streams no JSON at all
            parts.append(ToolCallPart(index=tool[0], id=None, name=None, arguments="{}"))

    def _count(self, usage: dict[str, Any]) -> None:
        """Usage from message_start, then message_delta's (cumulative: a later count replaces an earlier)."""
        if usage.get("input_tokens") is not None:
            self._input = int(usage["input_tokens"])
        if usage.get("output_tokens") is not None:
            self._output = int(usage["output_tokens"])
        if usage.get("cache_read_input_tokens") is not None:
            self._cache_read = int(usage["cache_read_input_tokens"])
        if usage.get("cache_creation_input_tokens") is not None:
            self._cache_write = int(usage["cache_creation_input_tokens"])


def _stream_error(error: dict[str, Any], payload: bytes) -> ProviderError:
    """An `error` event mid-stream: the stream broke off, as on the OpenAI path; retried only when the
    provider was overloaded (the agent retries only while nothing reached the client)."""
    log.warning("the provider sent an error mid-stream: %s", _head(payload))
    overloaded = error.get("type") in ("overloaded_error", "rate_limit_error")
    return provider_error("provider_stream_interrupted", retryable=overloaded)


def resolve(
    models: ModelMap,
    model: ResolvedModel,
    *,
    max_output_tokens: int | None,
    prompt_cache: bool | None,
    reasoning_budget: int | None = None,
) -> AnthropicEndpoint | None:
    """The endpoint for `model` when it routes to Anthropic (LiteLLM's files say so: litellm_tables), else
    None. `max_output_tokens`, `prompt_cache` and `reasoning_budget` are the models file's (None: not set
    there; the output limit then comes from LiteLLM's model map)."""
    routed = models.route(model.name)
    if routed is None or routed[1] != "anthropic":
        return None
    if max_output_tokens is None:
        info = models.info(model.name)
        known = info.max_output_tokens if info is not None else None
        max_output_tokens = known or DEFAULT_MAX_TOKENS
    return AnthropicEndpoint(
        url=messages_url(model.api_base),
        model=routed[0],
        api_key=api_key(model.configured_key, model.key_env),
        max_tokens=max_output_tokens,
        prompt_cache=True if prompt_cache is None else prompt_cache,
        thinking_budget=reasoning_budget,
    )
