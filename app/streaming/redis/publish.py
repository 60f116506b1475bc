"""Publishing committed frames to Redis without waiting for the previous publish's replies.

A pipeline's `execute` sends its commands and then waits for their replies before the next batch can
go: frames committed meanwhile waited one round trip in the outbox, and on a busy replica that round
trip is a turn of its event loop or two (measured at 40 streaming sessions on two replicas: 8-12 ms p50,
30-80 ms p99, most of what delivery on another replica added at p99). Here the publisher writes each
batch on one connection of its own as soon as it has it (redis-py writes at once, with no task per
command, when the connection has no socket timeout), and a second task reads the replies in order, with
a timeout of its own. Redis runs a connection's commands in the order they arrive, so each session's
entries still go in seq order.

A reply that is an error is expected for a duplicate (an entry id not above the stream's last) and
ignored, as before. A connection that fails (write error, read error, no reply within REPLY_TIMEOUT) is
dropped with the replies it still owed and a new one is opened for the next batch: what was lost in
between is in the log, and readers fill holes from it (redis_fanout).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Connection, ConnectionPool
from redis.exceptions import RedisError, ResponseError

log = logging.getLogger(__name__)

# Seconds the replies of a batch may take before its connection is given up.
REPLY_TIMEOUT = 5.0

_ERRORS = (RedisError, OSError, TimeoutError)

# A command's arguments, as redis-py packs them.
Command = tuple[Any, ...]


class RedisPublisher:
    """One connection, written by `send` and read by its own reply task."""

    def __init__(self, url: str, name: str) -> None:
        # No socket timeout (redis-py's default is 5 s): with one, each write is a task of its own under
        # asyncio.wait_for, sent a loop turn later. Replies have their own timeout (REPLY_TIMEOUT).
        self._pool = ConnectionPool.from_url(
            url, decode_responses=True, socket_connect_timeout=2, socket_timeout=None, client_name=name
        )
        self._connection: Connection | None = None
        # (connection, replies it owes) for each batch sent, oldest first.
        self._owed: deque[tuple[Connection, int]] = deque()
        self._sent = asyncio.Event()
        # Set whenever nothing is owed.
        self._settled = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self.failures = 0

    async def connect(self) -> None:
        """Opens the connection now rather than at the first batch (fails like `send`)."""
        await self._current()

    async def _current(self) -> Connection:
        if self._connection is None:
            connection: Connection = self._pool.make_connection()  # type: ignore[no-untyped-call]
            try:
                await connection.connect()  # type: ignore[no-untyped-call]
            except BaseException:
                await connection.disconnect(nowait=True)
                raise
            self._connection = connection
        if self._reader is None or self._reader.done():
            self._reader = asyncio.get_running_loop().create_task(self._read(), name="fanout-replies")
        return self._connection

    async def send(self, commands: Sequence[Command]) -> None:
        """Writes the commands in one go; returns once they are handed to the socket, not answered.
        Raises (and drops the connection) when the connection cannot be opened or written."""
        if not commands:
            return
        connection = await self._current()
        try:
            await connection.send_packed_command(connection.pack_commands(commands), check_health=False)
        except BaseException:
            await self._drop(connection)
            raise
        self._owed.append((connection, len(commands)))
        self._sent.set()

    async def _read(self) -> None:
        while True:
            await self._sent.wait()
            self._sent.clear()
            while self._owed:
                connection, count = self._owed[0]
                try:
                    async with asyncio.timeout(REPLY_TIMEOUT):
                        for _ in range(count):
                            await _reply(connection)
                except (TimeoutError, *_ERRORS) as exc:
                    log.warning("fan-out: publishing to Redis failed (%s); other replicas read the log", exc)
                    await self._drop(connection)
                    continue
                if self._owed and self._owed[0][0] is connection:
                    self._owed.popleft()
            self._settled.set()

    async def _drop(self, connection: Connection) -> None:
        """Gives the connection up, with every reply it still owes."""
        self.failures += 1
        if self._connection is connection:
            self._connection = None
        self._owed = deque(entry for entry in self._owed if entry[0] is not connection)
        if not self._owed:
            self._settled.set()
        await connection.disconnect(nowait=True)

    async def drained(self) -> None:
        """Returns once every batch sent is answered (or its connection dropped)."""
        while self._owed:
            self._settled.clear()
            await self._settled.wait()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._connection is not None:
            await self._connection.disconnect(nowait=True)
            self._connection = None
        await self._pool.aclose()


async def _reply(connection: Connection) -> None:
    # An error reply: a duplicate refused, or a key that is not a stream; the log has the frames either way.
    with contextlib.suppress(ResponseError):
        await connection.read_response(disconnect_on_error=False)


def xadd(key: str, seq: int, fields: dict[str, str], maxlen: int) -> Command:
    """XADD with the entry id `<seq>-0`, the stream capped at about `maxlen` entries."""
    return ("XADD", key, "MAXLEN", "~", maxlen, f"{seq}-0", *(x for pair in fields.items() for x in pair))
