"""The thread that runs every LiteLLM stream, on an event loop of its own.

LiteLLM's stream wrapper costs ~0.6 ms of CPU per chunk and rebuilds the whole response synchronously when
a stream ends (~110 ms per 1,000 chunks; ../shared/notes/litellm.md §2): on the service's loop that stall
would freeze every other session. Here `acompletion`, the iteration and `aclose` all run on one dedicated
loop (LiteLLM caches its SDK clients per loop, so it is always the same one), and parts travel to the
caller's loop in batches through a `PartChannel`: one `call_soon_threadsafe` per batch, not per part.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Coroutine, Sequence
from typing import Any

from app.llm.types import ProviderError, StreamPart

log = logging.getLogger(__name__)

_SHUTDOWN_TIMEOUT = 5.0


class PartChannel:
    """Parts from the worker thread to one consumer on another loop; the worker never waits on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._parts: list[StreamPart] = []
        self._ended = False
        self._error: ProviderError | None = None
        self._woken = False  # a wake-up is scheduled on the consumer's loop and not yet consumed
        self._ready = asyncio.Event()

    # --- worker side ---------------------------------------------------------------------------------

    def put(self, parts: Sequence[StreamPart]) -> None:
        with self._lock:
            if self._ended:
                return
            self._parts.extend(parts)
            wake = not self._woken
            self._woken = True
        if wake:
            self._wake()

    def end(self, error: ProviderError | None = None) -> None:
        """The stream is over (with `error` when it failed); later calls change nothing."""
        with self._lock:
            if self._ended:
                return
            self._ended, self._error = True, error
            wake = not self._woken
            self._woken = True
        if wake:
            self._wake()

    def _wake(self) -> None:
        # The consumer's loop may be gone already (server shut down mid-stream): nobody is waiting then.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._ready.set)

    # --- consumer side (its own loop) ----------------------------------------------------------------

    async def take(self) -> tuple[list[StreamPart], bool, ProviderError | None]:
        """Waits for the next batch: the parts, whether the stream ended, and its error if it failed."""
        await self._ready.wait()
        with self._lock:
            parts, self._parts = self._parts, []
            self._woken = False
            self._ready.clear()
            return parts, self._ended, self._error


class LiteLLMWorker:
    """One daemon thread running one event loop until `stop()`."""

    def __init__(self, name: str = "litellm-streams") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def start(self) -> None:
        """Starts the thread (idempotent). Its loop exists at once: work submitted now runs once it spins."""
        with self._lock:
            if self._thread is not None:
                return
            self._loop = loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._run, args=(loop,), name=self._name, daemon=True)
            self._thread.start()

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            loop.close()

    def submit(self, coroutine: Coroutine[Any, Any, None]) -> concurrent.futures.Future[None]:
        """Runs `coroutine` on the worker's loop; cancelling the returned future cancels it there."""
        if self._loop is None or self._loop.is_closed():
            coroutine.close()
            raise RuntimeError("the LiteLLM worker is not running")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    async def stop(self, before_close: Coroutine[Any, Any, None] | None = None) -> None:
        """Cancels what still runs, awaits `before_close` on the worker's loop, then ends the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or loop.is_closed():
            if before_close is not None:
                before_close.close()
            return
        try:
            done = asyncio.run_coroutine_threadsafe(_shutdown(loop, before_close), loop)
            await asyncio.wait_for(asyncio.wrap_future(done), _SHUTDOWN_TIMEOUT)
        except (TimeoutError, RuntimeError):
            log.warning("the LiteLLM worker did not shut down cleanly", exc_info=True)
        finally:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(loop.stop)
            await asyncio.to_thread(thread.join, _SHUTDOWN_TIMEOUT)


async def _shutdown(loop: asyncio.AbstractEventLoop, before_close: Coroutine[Any, Any, None] | None) -> None:
    current = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks(loop) if task is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if before_close is not None:
        try:
            await before_close
        except Exception:
            log.warning("closing LiteLLM's clients failed", exc_info=True)
    await loop.shutdown_asyncgens()
    await loop.shutdown_default_executor()
