"""The service's side of its LiteLLM child (litellm_child.py): started on the first LiteLLM stream, replaced
when it dies, ended by `stop()`.

One connection (a Unix socket pair, litellm_wire.py) carries every stream. Parts arrive in batches, each
stream's `PartQueue` wakes its consumer once per batch. A consumer that goes away (a stop, a closed
generator) sends a cancel for its stream and returns at once: it never waits for the child, whose own
cancellation closes the upstream connection. A child that dies ends every stream it had with a retryable
`provider_stream_interrupted` (the agent retries it only when nothing of the answer was streamed yet), and
the next stream starts another child.

The child is a plain process (`python -m app.llm.litellm_child`, the service's environment, CPU affinity
and priority inherited), its end of the connection as its stdin. It imports litellm (seconds), so the first
tail stream waits for that once; it exits when its connection closes, so none outlives the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.llm.litellm_wire import VERSION, Peer, decode_error, decode_part
from app.llm.provider_errors import provider_error
from app.llm.types import ProviderError, StreamPart

log = logging.getLogger(__name__)

# From the spawn to the child's hello: the import of litellm, 2-5 s on a 2-core machine, several times that
# on a busy one.
_HELLO_TIMEOUT = 120.0
STOP_TIMEOUT = 5.0


def child_died() -> ProviderError:
    return provider_error("provider_stream_interrupted", retryable=True)


class PartQueue:
    """One stream's parts, from the connection to the stream's consumer (both on the service's loop)."""

    __slots__ = ("_ready", "ended", "error", "parts")

    def __init__(self) -> None:
        self.parts: list[StreamPart] = []
        self.ended = False
        self.error: ProviderError | None = None
        self._ready = asyncio.Event()

    def put(self, parts: list[StreamPart]) -> None:
        self.parts.extend(parts)
        self._ready.set()

    def end(self, error: ProviderError | None) -> None:
        if not self.ended:
            self.ended, self.error = True, error
            self._ready.set()

    async def take(self) -> list[StreamPart]:
        """What arrived since the last take (waits for something: parts, or the end)."""
        await self._ready.wait()
        self._ready.clear()
        parts, self.parts = self.parts, []
        return parts


# Most bytes read from the child per turn of the loop. An overloaded child answers in bursts; read whole
# (256 KiB), a burst woke hundreds of streams at once and the loop ran them all before anything else (a
# 110 ms stall measured at 100 LiteLLM streams). 16 KiB is ~100 parts: the rest waits one loop iteration.
READ_SIZE = 16 * 1024


class Link(Peer, asyncio.BufferedProtocol):
    """The service's end of the connection to one child."""

    peer = "the LiteLLM child"

    def __init__(self, loop: asyncio.AbstractEventLoop, on_lost: Callable[[Link], None]) -> None:
        super().__init__(loop)
        self._on_lost = on_lost
        self._buffer = memoryview(bytearray(READ_SIZE))
        self._streams: dict[int, PartQueue] = {}
        self._ids = itertools.count(1)
        self.closed = False
        self.greeting: asyncio.Future[list[Any]] = loop.create_future()
        # Read whether or not anyone awaits it (a start cancelled meanwhile): no "never retrieved" warning.
        self.greeting.add_done_callback(lambda f: f.cancelled() or f.exception())

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._buffer[:nbytes])  # no copy: the reader copies it into its own buffer

    def data_received(self, data: bytes | memoryview) -> None:
        for message in self.read(data):
            kind = message[0]
            if kind == "parts":
                channel = self._streams.get(message[1])
                if channel is not None:
                    channel.put([decode_part(item) for item in message[2]])
            elif kind == "end":
                channel = self._streams.pop(message[1], None)
                if channel is not None:
                    channel.end(decode_error(message[2]))
            elif kind == "log":
                logging.getLogger(message[2]).log(message[1], "%s", message[3])
            elif kind == "hello" and not self.greeting.done():
                self.greeting.set_result(message[1:])

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._outbox.detach()
        streams, self._streams = self._streams, {}
        for channel in streams.values():
            channel.end(child_died())
        if not self.greeting.done():
            self.greeting.set_exception(ConnectionError("the LiteLLM child closed the connection"))
        self._on_lost(self)

    def send(self, message: list[Any]) -> None:
        self._outbox.send(message)

    def open(self, kwargs: dict[str, Any]) -> tuple[int, PartQueue]:
        stream_id, channel = next(self._ids), PartQueue()
        if self.closed:
            channel.end(child_died())
        else:
            self._outbox.send(["open", stream_id, kwargs])
            self._streams[stream_id] = channel
        return stream_id, channel

    def cancel(self, stream_id: int) -> None:
        if self._streams.pop(stream_id, None) is not None and not self.closed:
            self._outbox.send(["cancel", stream_id])

    def close(self) -> None:
        """Sends what is pending, then closes: the child cancels its streams and exits."""
        self._outbox.flush()
        if self._transport is not None:
            self._transport.close()


_COMMAND = [sys.executable, "-m", "app.llm.litellm_child"]
_ROOT = Path(__file__).resolve().parents[2]  # the directory that holds the `app` package


def _spawn(connection: socket.socket) -> subprocess.Popen[bytes]:
    """The child, its end of the connection as its stdin (closed here in any case)."""
    try:
        return subprocess.Popen(_COMMAND, stdin=connection.fileno(), env=_environment())
    finally:
        connection.close()


def _environment() -> dict[str, str]:
    """The service's environment, with the `app` package importable whatever the working directory."""
    env = dict(os.environ)
    paths = [str(_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


@dataclass(eq=False)
class _Child:
    process: subprocess.Popen[bytes]
    pidfd: int | None
    link: Link

    @property
    def pid(self) -> int:
        return self.process.pid

    async def end(self, grace: float) -> None:
        """Waits `grace` seconds for the process to exit (its connection is closed or lost), then kills it."""
        try:
            if not await _exited(self.pid, self.pidfd, grace):
                log.warning("the LiteLLM child %d did not exit within %.1f s: killing it", self.pid, grace)
                self.kill()
                await _exited(self.pid, self.pidfd, grace)
        finally:
            self.process.poll()  # reaps it once it has exited: no zombie
            if self.pidfd is not None:
                os.close(self.pidfd)
                self.pidfd = None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)


class LiteLLMProcess:
    """The child that runs the LiteLLM streams of one model layer; see the module docstring."""

    def __init__(self) -> None:
        self._child: _Child | None = None
        self._starting: asyncio.Task[_Child] | None = None
        self._ending: set[asyncio.Task[None]] = set()
        self._stopped = False

    @property
    def pid(self) -> int | None:
        """The running child's pid; None before the first LiteLLM stream, after `stop()`, or after the
        child died (until the next stream starts another)."""
        return self._child.pid if self._child is not None else None

    async def link(self) -> Link:
        """The running child's connection; starts a child if none runs (concurrent callers share it)."""
        child = self._child
        if child is not None and not child.link.closed:
            return child.link
        if self._stopped:
            raise provider_error("provider_unavailable")
        if self._starting is None or self._starting.done():
            self._starting = asyncio.get_running_loop().create_task(self._start(), name="litellm-child-start")
        starting = self._starting
        try:
            # Shielded: a stream stopped while it waits must not cancel the start others wait for.
            child = await asyncio.shield(starting)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if starting.cancelled() and current is not None and not current.cancelling():
                raise provider_error("provider_unavailable") from None  # stop() ended the start
            raise
        except (OSError, RuntimeError, TimeoutError) as exc:
            raise provider_error("provider_unavailable") from exc
        return child.link

    async def _start(self) -> _Child:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        try:
            # On the loop's own thread: a child inherits the CPU affinity of the thread that starts it,
            # and a worker thread's may not be the service's. A spawn (vfork and exec) takes milliseconds,
            # once per child.
            process = _spawn(theirs)  # closes `theirs`
            pid = process.pid
            child = _Child(process, _pidfd(pid), Link(loop, self._lost))
            await loop.create_unix_connection(lambda: child.link, sock=ours)
        except BaseException:
            ours.close()  # a child started meanwhile sees its connection end, and exits
            raise
        child.link.send(["init", VERSION, self._init()])
        try:
            async with asyncio.timeout(_HELLO_TIMEOUT):
                hello = await child.link.greeting
            if hello != [VERSION, pid]:
                raise RuntimeError(f"the LiteLLM child {pid} answered {hello!r} (wire version {VERSION})")
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                log.exception("the LiteLLM child %d did not start", pid)
            child.link.abort()
            self._end_later(child, 1.0)
            raise
        self._child = child
        log.info("LiteLLM child %d started", pid)
        return child

    def _init(self) -> dict[str, Any]:
        return {"log_level": logging.getLogger().getEffectiveLevel()}

    def _lost(self, link: Link) -> None:
        child = self._child
        if child is None or child.link is not link:
            return  # a start that failed, or stop(): they end the process themselves
        self._child = None
        log.error("the LiteLLM child %d is gone; the next LiteLLM stream starts another", child.pid)
        self._end_later(child, STOP_TIMEOUT)

    def _end_later(self, child: _Child, grace: float) -> None:
        task = asyncio.get_running_loop().create_task(child.end(grace), name="litellm-child-end")
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)

    async def stop(self) -> None:
        """Closes the connection: the child cancels its streams, closes their upstream connections and
        exits; killed if it has not within STOP_TIMEOUT. No child starts afterwards."""
        self._stopped = True
        starting = self._starting
        if starting is not None and not starting.done():
            starting.cancel()
            await asyncio.wait([starting])
        child, self._child = self._child, None
        if child is not None:
            child.link.close()
            await child.end(STOP_TIMEOUT)
        if self._ending:
            await asyncio.wait(list(self._ending))


def _pidfd(pid: int) -> int | None:
    """A descriptor for exactly this process (Linux 5.3+): no signal can reach a recycled pid."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        fd: int = opener(pid)
    except OSError:
        return None
    return fd


async def _exited(pid: int, pidfd: int | None, timeout: float) -> bool:
    """Whether the process has exited within `timeout` seconds (a pidfd turns readable when it does)."""
    if pidfd is None:
        return await _polled_exit(pid, timeout)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(pidfd, readable)
    try:
        async with asyncio.timeout(timeout):
            await done
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(pidfd)
    return True


async def _polled_exit(pid: int, timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return True  # the pid now belongs to someone else's process: ours is gone
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.02)
