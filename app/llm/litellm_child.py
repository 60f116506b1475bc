"""The LiteLLM child: the process where every LiteLLM stream of the service runs, on a loop of its own.

LiteLLM's stream wrapper costs ~0.45 ms of CPU per chunk, rebuilds the whole response synchronously when a
stream ends, and leaves a backlog of objects that made the collector's full passes last hundreds of ms
(measured on this project's machines). In the service's process that CPU, that GIL and that garbage
were shared with the loop serving every session; here they are not, and on a machine with more than one
core LiteLLM gets a core of its own. The service talks to this process over one socket (litellm_wire.py):
`acompletion`, the iteration (with LiteLLM's kept chunks trimmed), `aclose` and the mapping of errors all
happen here; the service receives parts in batches, and a safe `ProviderError` when a call fails (the
upstream's own words go to the log only).

The service starts it as a plain process (`python -m app.llm.litellm_child`) with the first stream of a
tail model, the only time litellm is imported. `run` imports it and serves the connection from the service
until it closes, then returns (the child exits). The child ignores SIGINT: a Ctrl-C reaches the whole
process group, and the service, which stops its turns first, closes the connection itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from app.llm.litellm_import import import_litellm
from app.llm.litellm_wire import VERSION, Outbox, Peer, encode_error, encode_part
from app.llm.provider_errors import call_failed, hidden_failure, map_error
from app.llm.types import (
    FinishPart,
    ProviderError,
    ReasoningPart,
    StreamPart,
    TextPart,
    ToolCallPart,
    UsagePart,
)

log = logging.getLogger(__name__)

# When the child and the service want the same core, the service's loop (every session's stream, stops,
# history) goes first: LiteLLM's ~0.45 ms per chunk is what waits. Measured on one shared core at 50-100
# LiteLLM streams, more than the core can serve: the service's loop lag max went from ~110 ms at equal
# priority to the figures in bench/results. Only ever raised (lowering needs privileges).
NICENESS_ABOVE_SERVICE = 5
# How long the streams cancelled at the end get to close their upstream connections.
_CLOSE_SECONDS = 3.0


def run(sock: socket.socket) -> int:
    """Serves the service's connection on `sock` until it closes; the exit code of the child."""
    litellm = import_litellm()
    asyncio.run(_serve(litellm, sock))
    return 0


async def _serve(litellm: ModuleType, sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    server = _Server(litellm, loop)
    await loop.create_unix_connection(lambda: server, sock=sock)
    try:
        await server.closed
    finally:
        await server.shutdown()


class _Server(Peer, asyncio.Protocol):
    """The child's end of the connection: one task per stream, parts out in batches."""

    peer = "the service"

    def __init__(self, litellm: ModuleType, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self._litellm = litellm
        self._loop = loop
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self.closed: asyncio.Future[None] = loop.create_future()

    def data_received(self, data: bytes) -> None:
        for message in self.read(data):
            kind = message[0]
            if kind == "open":
                self._open(message[1], message[2])
            elif kind == "cancel":
                task = self._tasks.pop(message[1], None)
                if task is not None:
                    task.cancel()
            elif kind == "init":
                self._init(message[1], message[2])

    def connection_lost(self, exc: Exception | None) -> None:
        self._outbox.detach()
        if not self.closed.done():
            self.closed.set_result(None)

    def _init(self, version: int, config: dict[str, Any]) -> None:
        if version != VERSION:
            log.error("the service speaks wire version %s, this child %s", version, VERSION)
            assert self._transport is not None
            self._transport.close()
            return
        _forward_logging(self._outbox, int(config["log_level"]))
        self._outbox.send(["hello", VERSION, os.getpid()])

    def _open(self, stream_id: int, kwargs: dict[str, Any]) -> None:
        task = self._loop.create_task(self._pump(stream_id, kwargs), name=f"litellm-stream-{stream_id}")
        self._tasks[stream_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(stream_id, None))

    async def _pump(self, stream_id: int, kwargs: dict[str, Any]) -> None:
        def emit(parts: list[StreamPart]) -> None:
            self._outbox.send_parts(stream_id, [encode_part(part) for part in parts])

        try:
            error = await read_stream(self._litellm, kwargs, emit)
        except asyncio.CancelledError:
            raise  # the service has forgotten this stream: no "end"
        except Exception:
            log.exception("a LiteLLM stream failed unexpectedly")
            error = call_failed()
        self._outbox.send(["end", stream_id, encode_error(error)])

    async def shutdown(self) -> None:
        """The service is gone or done: every stream is cancelled (its aclose closes the upstream
        connection), then LiteLLM's clients for this loop are closed."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_CLOSE_SECONDS)
        await forget_loop_clients(self._litellm)


async def read_stream(
    litellm: ModuleType, kwargs: dict[str, Any], emit: Callable[[list[StreamPart]], None]
) -> ProviderError | None:
    """One `acompletion` stream: its parts to `emit`, chunk by chunk; the mapped error if it failed."""
    try:
        response = await litellm.acompletion(**kwargs)
    except Exception as exc:
        return map_error(litellm, exc, streamed=False)
    kept = getattr(response, "chunks", None)
    try:
        async for chunk in response:
            parts = _parts(chunk, kept)
            if parts:
                emit(parts)
            if type(kept) is list and len(kept) >= TRIM_AT:
                trim_kept_chunks(kept)
        # LiteLLM ends every stream as if complete: what it hid, if anything.
        return hidden_failure(response, kwargs.get("model"))
    except Exception as exc:
        return map_error(litellm, exc, streamed=True)
    finally:
        # Without aclose a cancelled or abandoned stream keeps the upstream request open (notes §4).
        await response.aclose()


# LiteLLM's stream wrapper keeps every chunk it returned (`CustomStreamWrapper.chunks`, ~4 KB and a dozen
# objects each) only to rebuild the whole response when the stream ends: for the usage (read from the
# chunks that carry one), for its logging callbacks (none here) and to compare the last two chunks
# (its repetition check). Kept whole, that list grows for the stream's life, the rebuild at the end takes
# ~110 ms per 1,000 chunks, and at 100 streams the collector walks hundreds of thousands of live objects
# (full collections of 200-400 ms were measured). Trimmed to the chunks with usage plus the last two, usage
# and the checks come out the same (tests/api/test_providers.py) at a constant cost.
TRIM_AT = 64
_LAST_KEPT = 2


def trim_kept_chunks(chunks: list[Any]) -> None:
    """Keeps the chunks that carry usage, in order, and the last two; drops the rest, in place."""
    older = chunks[:-_LAST_KEPT]
    chunks[:] = [*(c for c in older if getattr(c, "usage", None) is not None), *chunks[-_LAST_KEPT:]]


def _parts(chunk: Any, kept: Any = None) -> list[StreamPart]:
    parts: list[StreamPart] = []
    choices = chunk.choices
    if choices:
        choice = choices[0]
        delta = choice.delta
        if delta is not None:
            # LiteLLM gives every provider's streamed reasoning as `reasoning_content`.
            reasoning = getattr(delta, "reasoning_content", None)
            if reasoning and isinstance(reasoning, str):
                parts.append(ReasoningPart(reasoning))
            if delta.content:
                parts.append(TextPart(delta.content))
            for tc in delta.tool_calls or ():
                fn = tc.function
                parts.append(
                    ToolCallPart(
                        index=tc.index or 0,
                        id=tc.id,
                        name=fn.name if fn is not None else None,
                        arguments=(fn.arguments or "") if fn is not None else "",
                    )
                )
        if choice.finish_reason:
            parts.append(FinishPart(choice.finish_reason))
    usage = getattr(chunk, "usage", None)
    if usage is not None:
        prompt_details = getattr(usage, "prompt_tokens_details", None)
        completion_details = getattr(usage, "completion_tokens_details", None)
        reasoning = getattr(completion_details, "reasoning_tokens", None)
        parts.append(
            UsagePart(
                prompt_tokens=int(usage.prompt_tokens or 0),
                completion_tokens=int(usage.completion_tokens or 0),
                total_tokens=int(usage.total_tokens or 0),
                estimated=not _provider_sent_usage(kept),
                cache_read_tokens=int(getattr(prompt_details, "cached_tokens", None) or 0),
                cache_write_tokens=int(getattr(usage, "cache_creation_input_tokens", None) or 0),
                # LiteLLM reports 0 where the provider said nothing: only a count is one.
                reasoning_tokens=reasoning if isinstance(reasoning, int) and reasoning > 0 else None,
            )
        )
    return parts


def _provider_sent_usage(kept: Any) -> bool:
    """Whether the upstream itself reported usage. LiteLLM emits a usage chunk either way (with no
    provider usage it counts the tokens itself), but keeps a provider's usage chunk in `chunks`, which
    `trim_kept_chunks` never drops; without that list nothing says, and the usage counts as the provider's."""
    if type(kept) is not list:
        return True
    return any(getattr(c, "usage", None) is not None for c in kept)


class _ToService(logging.Handler):
    """The child's log records, sent to the service, which logs them through its own configuration."""

    def __init__(self, outbox: Outbox) -> None:
        super().__init__()
        self._outbox = outbox
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:
            self.handleError(record)
            return
        if self._outbox.attached:
            self._outbox.send(["log", record.levelno, record.name, text])
        else:  # the connection is gone: the service's stderr, which this process shares
            print(f"{record.levelname} {record.name}: {text}", file=sys.stderr)


def _forward_logging(outbox: Outbox, level: int) -> None:
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _ToService)]:
        root.removeHandler(handler)
    root.addHandler(_ToService(outbox))
    root.setLevel(level)


async def forget_loop_clients(litellm: ModuleType) -> None:
    """Closes the SDK clients LiteLLM cached for the running loop, and drops them.

    The cache keys them by `id(loop)`: a later loop with a recycled id must not be handed a dead client.
    """
    cache = getattr(litellm, "in_memory_llm_clients_cache", None)
    entries = getattr(cache, "cache_dict", None)
    if not isinstance(entries, dict):
        return
    suffix = f"-{id(asyncio.get_running_loop())}"
    for key in [k for k in entries if isinstance(k, str) and k.endswith(suffix)]:
        client = entries.pop(key, None)
        getattr(cache, "ttl_dict", {}).pop(key, None)
        close = getattr(client, "aclose", None) or getattr(client, "close", None)
        if close is None:
            continue
        with contextlib.suppress(Exception):
            result = close()
            if asyncio.iscoroutine(result):
                await result


def main() -> int:
    """`python -m app.llm.litellm_child`, started by the service (litellm_process.py) with its end of the
    connection as stdin; the environment, CPU affinity and priority are the service's, inherited."""
    sock = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    # A Ctrl-C reaches the whole process group; the service, which stops its turns first, closes the
    # connection itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(os, "nice"):
        with contextlib.suppress(OSError):
            os.nice(NICENESS_ABOVE_SERVICE)
    return run(sock)


if __name__ == "__main__":
    sys.exit(main())
