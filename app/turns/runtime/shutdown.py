"""Graceful shutdown: turns stop with their state committed, the log is flushed, every stream ends.

uvicorn runs the lifespan's shutdown only once every connection has closed, and an SSE connection never
closes by itself; a server that waited for the lifespan would wait forever (or cut the streams without
ending them). So the drain starts at the signal: a handler is chained in front of the server's own
(main thread only), and the lifespan's exit runs the same drain for shutdowns without a signal.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from app.streaming.broker import Broker
from app.streaming.log.write_behind import WriteBehind
from app.turns.runtime.runner import Runner

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Drain:
    def __init__(self, runner: Runner, writer: WriteBehind, broker: Broker, *, timeout: float) -> None:
        self._runner = runner
        self._writer = writer
        self._broker = broker
        self._timeout = timeout
        self._task: asyncio.Task[None] | None = None

    def request(self) -> None:
        """Starts the drain (once); returns at once."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drain(), name="drain")

    async def run(self) -> None:
        """Starts the drain if needed and waits for it."""
        self.request()
        assert self._task is not None
        await asyncio.shield(self._task)

    async def _drain(self) -> None:
        started = asyncio.get_running_loop().time()
        # Whatever happens to the turns and the flush, the streams are closed: uvicorn waits for them.
        try:
            await asyncio.wait_for(asyncio.shield(self._runner.shutdown()), self._timeout)
        except TimeoutError:
            log.error("running turns did not stop within %.1f s; closing the streams anyway", self._timeout)
        except Exception:
            log.exception("stopping the running turns failed; closing the streams anyway")
        try:
            await self._writer.flush()
        except Exception:
            log.exception("the last event log batch could not be written")
        self._broker.close_all()
        log.info("drained in %.3f s", asyncio.get_running_loop().time() - started)


@contextmanager
def drain_on_signals(drain: Drain) -> Iterator[None]:
    """While inside, SIGTERM and SIGINT also start the drain, then reach the server's own handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    # A signal handler runs in whatever context the main thread is in when the signal comes, a request's
    # maybe: the drain starts in the lifespan's (its log lines must not carry that request's id).
    lifespan = contextvars.copy_context()

    def handler(sig: int, frame: FrameType | None) -> None:
        loop.call_soon_threadsafe(drain.request, context=lifespan.copy())
        chained = previous[signal.Signals(sig)]
        if callable(chained):
            chained(sig, frame)

    # Only in front of a handler the server installed: a default disposition is left alone.
    chained = [s for s, old in previous.items() if callable(old) and old is not signal.default_int_handler]
    for sig in chained:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig in chained:
            if signal.getsignal(sig) is handler:
                signal.signal(sig, previous[sig])
