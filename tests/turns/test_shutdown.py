"""Graceful shutdown (app.turns.runtime.shutdown): the drain runs once, stops the running turns as
interrupted, flushes the event log and ends every stream, and ends the streams even when stopping the turns
times out or fails, or the last batch cannot be written. The signals start it too. With a real runner, writer
and broker on a real SQLite file (tests/support/runtime.py); over a real server:
tests/streams/test_shutdown.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sqlite3
from collections.abc import AsyncIterator, Callable
from types import FrameType

import pytest

from app.observability.context import request_id_var
from app.protocol.events import AgentStatus
from app.settings import Settings
from app.storage import event_log
from app.storage.blobs import DatabaseBlobs
from app.streaming.broker import Subscription
from app.turns.runtime.runner import Runner
from app.turns.runtime.shutdown import Drain, drain_on_signals
from tests.support.runtime import Runtime, runtime

pytestmark = pytest.mark.anyio

SID, OTHER = "s_draining", "s_other"
LOGGER = "app.turns.runtime.shutdown"


@pytest.fixture
async def parts(settings: Settings) -> AsyncIterator[Runtime]:
    async with runtime(settings.model_copy(update={"database_busy_timeout_ms": 100})) as built:
        yield built


def drain_of(parts: Runtime, *, timeout: float = 5.0) -> Drain:
    return Drain(parts.runner, parts.writer, parts.broker, timeout=timeout)


async def frames_until_closed(subscription: Subscription) -> list[str]:
    """The types of every frame the stream sends before it ends."""
    async with asyncio.timeout(5):
        return [frame.type async for batch in subscription.batches() for frame in batch]


async def eventually(predicate: Callable[[], bool]) -> None:
    deadline = asyncio.get_running_loop().time() + 5
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


async def test_the_drain_interrupts_the_turns_flushes_the_log_and_ends_the_streams(
    parts: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    await parts.start_turn(await parts.add_session(SID))
    stream = await parts.broker.subscribe(SID, after=None)
    parts.writer.publisher(OTHER).emit(AgentStatus, status="thinking")  # only a flush logs it
    drain = drain_of(parts)

    with caplog.at_level(logging.INFO, logger=LOGGER):
        drain.request()
        drain.request()
        await drain.run()
        await drain.run()

    assert len([m for m in messages(caplog, logging.INFO) if m.startswith("drained in")]) == 1  # once
    assert parts.runner.closing and parts.broker.closed
    assert (await parts.history(SID))[-1] == ("turn_done", "interrupted")
    assert await frames_until_closed(stream) == ["agent_status", "agent_cancelled", "turn_done"]
    async with parts.database.session() as db:
        assert await event_log.last_event_seq(db, OTHER) == 1


async def test_turns_that_do_not_stop_in_time_do_not_keep_the_streams_open(
    parts: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    turn_id = await parts.start_turn(await parts.add_session(SID))
    stream = await parts.broker.subscribe(SID, after=None)
    drain = drain_of(parts, timeout=0.1)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        # Another session's write holds the writer: the stopped turn cannot commit its end meanwhile.
        async with parts.writer.transaction(OTHER):
            drain.request()
            await eventually(lambda: bool(messages(caplog, logging.ERROR)))
            assert messages(caplog, logging.ERROR) == [
                "running turns did not stop within 0.1 s; closing the streams anyway"
            ]
            assert not parts.broker.closed  # the flush waits for the writer too
        await drain.run()
    assert parts.broker.closed
    await frames_until_closed(stream)
    # The turns' stop was not cancelled by the timeout: the turn still ends as interrupted.
    await parts.runner.turn_end(turn_id)
    assert (await parts.history(SID))[-1] == ("turn_done", "interrupted")


async def test_a_last_batch_that_cannot_be_written_does_not_keep_the_streams_open(
    parts: Runtime, caplog: pytest.LogCaptureFixture, database_url: str
) -> None:
    stream = await parts.broker.subscribe(OTHER, after=None)
    parts.writer.publisher(OTHER).emit(AgentStatus, status="thinking")
    holder = sqlite3.connect(database_url.removeprefix("sqlite+aiosqlite:///"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds SQLite's write lock past the busy timeout
    try:
        with caplog.at_level(logging.ERROR, logger=LOGGER):
            await drain_of(parts).run()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert messages(caplog, logging.ERROR) == ["the last event log batch could not be written"]
    assert parts.broker.closed
    assert await frames_until_closed(stream) == []


class BrokenRunner(Runner):
    """Runner.shutdown gathers the turns' stops with return_exceptions, so no real failure reaches the drain:
    this one fails as a bug in it would."""

    async def shutdown(self) -> None:
        raise RuntimeError("a bug while stopping the turns")


async def test_turns_whose_stop_fails_do_not_keep_the_streams_open(
    parts: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    broken = BrokenRunner(
        parts.settings,
        parts.database,
        parts.writer,
        parts.models,
        parts.tools,
        parts.live,
        parts.broker,
        blobs=DatabaseBlobs(parts.database, parts.settings.files_chunk_bytes),
    )
    stream = await parts.broker.subscribe(SID, after=None)
    parts.writer.publisher(OTHER).emit(AgentStatus, status="thinking")
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        await Drain(broken, parts.writer, parts.broker, timeout=5.0).run()
    assert messages(caplog, logging.ERROR) == [
        "stopping the running turns failed; closing the streams anyway"
    ]
    async with parts.database.session() as db:
        assert await event_log.last_event_seq(db, OTHER) == 1  # flushed all the same
    assert parts.broker.closed
    assert await frames_until_closed(stream) == []


async def test_sigterm_starts_the_drain_and_reaches_the_servers_handler(parts: Runtime) -> None:
    received: list[int] = []

    def servers_handler(sig: int, _frame: FrameType | None) -> None:
        received.append(sig)

    drain = drain_of(parts)
    previous = signal.signal(signal.SIGTERM, servers_handler)
    try:
        with drain_on_signals(drain):
            os.kill(os.getpid(), signal.SIGTERM)
            await eventually(lambda: parts.broker.closed)
        await drain.run()  # the drain the signal started
        assert received == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is servers_handler  # restored on the way out
    finally:
        signal.signal(signal.SIGTERM, previous)


async def test_the_drain_a_signal_starts_runs_outside_the_request_the_signal_interrupted(
    parts: Runtime,
) -> None:
    """A signal handler runs in the context the main thread is in when the signal comes: SIGTERM during a
    request's step started the drain in that request's context, and its log line ("drained in …") carried
    that request's id (seen in tests/test_launcher_checks.py's JSON log)."""
    seen: list[str] = []
    drain = drain_of(parts)
    original = drain.request

    def request() -> None:
        seen.append(request_id_var.get())
        original()

    drain.request = request  # type: ignore[method-assign]
    previous = signal.signal(signal.SIGTERM, lambda _sig, _frame: None)
    try:
        with drain_on_signals(drain):
            token = request_id_var.set("req_in_flight")
            try:
                os.kill(os.getpid(), signal.SIGTERM)  # handled before the next line, in this context
            finally:
                request_id_var.reset(token)
            await eventually(lambda: parts.broker.closed)
            assert seen == ["-"]  # the signal's request of the drain
        await drain.run()  # (the lifespan's own request of it comes next)
    finally:
        signal.signal(signal.SIGTERM, previous)
