"""Fan-out across replicas: committed events go to a Redis Stream per session, and one reader per replica
feeds the local broker's channels from the streams of the sessions its clients watch.

The event log stays the only truth; Redis only carries events faster than polling it would.

- Publishing: after each commit the write-behind hands its frames to `deliver`, which queues them for one
  publisher task (woken first, so that the Redis hop does not also wait for the local sends) and to this
  process's broker (local streams get them at once, never through Redis). The publisher writes each
  batch on a connection of its own without waiting for the previous batch's replies (redis_publish), as
  one XADD per run of consecutive frames of a session, its id the run's last seq (redis_entries: a run
  published twice is refused). Each stream is capped (MAXLEN ~) and expires once its session is idle for
  STREAM_TTL (refreshed at most every EXPIRE_EVERY, not with every batch).
- Reading: one task, one connection, XREAD BLOCK over the streams of every watched session, each from the
  last seq its channel delivered, so nothing falls between a stream's replay from the log and its live
  frames. A new watched session wakes the reader through a wake stream of this replica's own.
- A session whose turn runs here is left out of the XREAD: its frames reach its streams from this
  replica's write-behind, and reading them back cost a tenth of a streaming replica's CPU. The frames
  another replica logs for a session whose turn it does not run (a message posted there, a queue edit)
  come with a notice naming the session, on a stream every replica reads; the reader then reads the
  session's stream once. When the turn here ends, the reader takes the stream in again (`turn_over`).
- Holes: a frame that does not follow its channel's last one (a publish lost while Redis was away, a
  stream trimmed past a slow reader) is held by the channel and the frames before it are read from the log
  (`_fill`); the sequencer commits a number only after every smaller one, so the log has them. If
  retention pruned them, the session's streams end and their clients resume with a resync.
- Redis down: the reader polls the log every `poll_interval` for the watched sessions (latency grows,
  nothing is lost), pings Redis meanwhile, and once it answers reads the log once more and goes back to
  XREAD. Failed publishes are dropped (the log has the frames). Every `sweep_interval` a task beside the
  reader compares each watched channel with the log's head: whatever could still slip through arrives then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.observability.hooks import fanout_backfilled, redis_state
from app.streaming.broker import Broker, Channel, LoadFrames, OnGap, OnWatch
from app.streaming.frames import Frame
from app.streaming.redis.entries import STREAM_TTL, noticed, publish_commands, unpack_all
from app.streaming.redis.publish import Command, RedisPublisher

log = logging.getLogger(__name__)

BLOCK_MS = 2000
READ_COUNT = 2000
POLL_INTERVAL = 0.5
SWEEP_INTERVAL = 5.0
# Frames waiting for the publisher beyond this are dropped (Redis is away; the log has them).
OUTBOX_LIMIT = 100_000
# Attempts to fill a hole from the log before its streams are ended (they resume from the log).
FILL_ATTEMPTS = 20

# The log's last seq of each of these sessions (absent: no event).
LoadHeads = Callable[[list[str]], Awaitable[dict[str, int]]]
# The broker this relay feeds, made with the relay's hooks: a hole to fill, a session newly watched.
MakeBroker = Callable[[OnGap, OnWatch], Broker]

_ERRORS = (RedisError, OSError, TimeoutError)


def redis_client(url: str, **options: Any) -> Redis:
    return Redis.from_url(url, decode_responses=True, socket_connect_timeout=2, **options)


class RedisRelay:
    """Publishes this replica's committed frames and feeds its broker with every other replica's."""

    def __init__(
        self,
        url: str,
        prefix: str,
        load_frames: LoadFrames,
        load_heads: LoadHeads,
        make_broker: MakeBroker,
        *,
        poll_interval: float = POLL_INTERVAL,
        sweep_interval: float = SWEEP_INTERVAL,
    ) -> None:
        self._prefix = prefix
        self._load_frames = load_frames
        self._load_heads = load_heads
        self._poll_interval = poll_interval
        self._sweep_interval = sweep_interval
        # Named, so that CLIENT LIST shows what each connection is for (tests count them).
        self._client = redis_client(url, socket_timeout=None, client_name=f"{prefix}:fanout")
        # Committed frames go out on a connection of their own, without waiting for earlier replies.
        self._publisher = RedisPublisher(url, f"{prefix}:fanout-publish")
        # The reader's own connection: a blocked XREAD holds it. Its timeout is the read loop's own: with a
        # socket timeout redis-py sends each command from a task of its own, a loop turn later.
        self._reader = redis_client(
            url,
            socket_timeout=None,
            single_connection_client=True,
            client_name=f"{prefix}:fanout-reader",
        )
        self._wake_key = f"{prefix}:wake:{uuid.uuid4().hex}"
        self._wake_last = "0-0"
        # Sessions whose turn runs here (the runner says, `running`: this relay is its notifier,
        # turns.runtime.notifier): they are left out of the reader's XREAD, and frames of the others are
        # announced on the notice stream.
        self._here: set[str] = set()
        self._notice_key = f"{prefix}:notices"
        self._notice_last = "0-0"
        self._left_out: set[str] = set()
        self._to_catch: set[str] = set()
        self._catcher: asyncio.Task[None] | None = None
        # This process's broker: made here, with this relay's hooks (shared mode: streaming.broker).
        self.broker = make_broker(self.gap, self.watch)
        self._outbox: list[tuple[str, Frame]] = []
        self._outbox_ready = asyncio.Event()
        # When each stream's expiry was last set (monotonic seconds).
        self._expired: dict[str, float] = {}
        self._reading: set[str] = set()
        self._wake_wanted = False
        self._waker: asyncio.Task[None] | None = None
        self._filling: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.connected = False
        self._was_connected = False
        self._publish_failing = False

    def runs_here(self, session_id: str) -> bool:
        return session_id in self._here

    def running(self, session_id: str, here: bool) -> None:
        """The runner's notice: a turn of the session runs here from now on (`here`), or no longer."""
        if here:
            self._here.add(session_id)
        else:
            self._here.discard(session_id)

    def key(self, session_id: str) -> str:
        return f"{self._prefix}:events:{session_id}"

    # --- publishing ------------------------------------------------------------------------------------

    def deliver(self, committed: Sequence[tuple[str, Frame]]) -> None:
        """The write-behind's delivery: local streams at once, other replicas through Redis."""
        # The publisher first: its wake-up then comes before those of the local streams.
        if len(self._outbox) < OUTBOX_LIMIT:
            self._outbox.extend(committed)
            self._outbox_ready.set()
        self.broker.deliver(committed)

    async def _publish_loop(self) -> None:
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready.clear()
            batch, self._outbox = self._outbox, []
            try:
                await self._publish(batch)
            except _ERRORS as exc:
                if not self._publish_failing:
                    log.warning("fan-out: publishing to Redis failed (%s); other replicas poll the log", exc)
                self._publish_failing = True
                await asyncio.sleep(self._poll_interval)
            else:
                if self._publish_failing:
                    log.warning("fan-out: publishing to Redis works again")
                self._publish_failing = False

    async def _publish(self, batch: list[tuple[str, Frame]]) -> None:
        # Handed to the socket, not answered: the publisher reads the replies (redis_publish says why).
        await self._publisher.send(self._commands(batch))

    def _commands(self, batch: list[tuple[str, Frame]]) -> list[Command]:
        return publish_commands(batch, self.key, self._expired, self._notice_key, self.runs_here)

    # --- reading ---------------------------------------------------------------------------------------

    def watch(self, session_id: str) -> None:
        """The broker's `on_watch`: a session got its first stream here; the reader must include it.
        Wakes are coalesced in one task: a hundred new streams at once cost a few XADDs on one
        connection, not a hundred connections."""
        if session_id in self._reading or not self.connected:
            return
        self._wake_reader()

    def turn_over(self, session_id: str) -> None:
        """A turn of the session ended here and no other runs here: if the reader left its stream out,
        it reads it again from now on (another replica may run its next turn)."""
        if session_id in self._left_out and self.connected:
            self._wake_reader()

    def _wake_reader(self) -> None:
        self._wake_wanted = True
        if self._waker is None or self._waker.done():
            self._waker = asyncio.get_running_loop().create_task(self._wake(), name="fanout-wake")
            self._tasks.add(self._waker)
            self._waker.add_done_callback(self._tasks.discard)

    async def _wake(self) -> None:
        # Each XADD makes the reader read the watched sessions again: one asked for after an XADD was
        # sent gets another.
        while self._wake_wanted:
            self._wake_wanted = False
            # If Redis fails here the reader is not blocked on it: it polls the log, these sessions too.
            with contextlib.suppress(*_ERRORS):
                async with asyncio.timeout(5):
                    await self._client.xadd(self._wake_key, {"w": "1"}, maxlen=16, approximate=True)
                    await self._client.expire(self._wake_key, STREAM_TTL)

    async def _read_loop(self) -> None:
        while True:
            if not self.connected:
                await self._until_connected()
            watched = self.broker.watched()
            streams = {self._wake_key: self._wake_last}
            # A turn running here feeds its session's streams itself: reading its frames back from
            # Redis was a tenth of a streaming replica's CPU. Other replicas' frames for it come
            # with a notice.
            self._left_out = {sid for sid in watched if sid in self._here}
            streams[self._notice_key] = self._notice_last
            streams.update({self.key(s): f"{seq}-0" for s, seq in watched.items() if s not in self._left_out})
            self._reading = set(watched)
            try:
                async with asyncio.timeout(BLOCK_MS / 1000 + 5):
                    reply = await self._reader.xread(streams, count=READ_COUNT, block=BLOCK_MS)  # type: ignore[arg-type]
            except _ERRORS as exc:
                self._set_connected(False, exc)
                continue
            self._apply(reply or [])

    async def _sweep_loop(self) -> None:
        """Every `sweep_interval`, while Redis answers, every watched channel brought up to the log's head.
        A task of its own: inside the read loop, each sweep's read of the log held up every stream's live
        frames (measured: deliveries on the other replica late by 20-70 ms, every five seconds). A frame
        the sweep and the reader both bring is delivered once (a channel skips what it has)."""
        while True:
            await asyncio.sleep(self._sweep_interval)
            if self.connected:
                await self._poll_log()

    def _apply(self, reply: Any) -> None:
        start = len(self._prefix) + len(":events:")
        # A list of [key, entries] pairs (RESP2), or a mapping of them (RESP3).
        for key, entries in reply.items() if isinstance(reply, dict) else reply:
            if key == self._wake_key:
                self._wake_last = entries[-1][0]
                continue
            if key == self._notice_key:
                self._notice_last = entries[-1][0]
                self._catch_up(noticed(entries) & self._left_out)
                continue
            frames = unpack_all(entries)
            channel = self.broker.existing(key[start:])
            if channel is not None:
                channel.deliver(frames)

    def _catch_up(self, session_ids: set[str]) -> None:
        """Noticed sessions whose stream the reader leaves out: read once, in one task for all."""
        self._to_catch |= session_ids
        if self._to_catch and (self._catcher is None or self._catcher.done()):
            self._catcher = self._spawn(self._catching(), "fanout-catch-up")

    async def _catching(self) -> None:
        while self._to_catch:
            session_ids, self._to_catch = self._to_catch, set()
            for sid in session_ids:
                channel = self.broker.existing(sid)
                if channel is None or not channel.subscribers:
                    continue
                # What fails here, the sweep of the log brings (and a hole, the next frame's fill).
                with contextlib.suppress(*_ERRORS):
                    async with asyncio.timeout(5):
                        after = f"{channel.delivered_seq + 1}-0"
                        entries: Any = await self._client.xrange(self.key(sid), min=after, count=READ_COUNT)
                    channel.deliver(unpack_all(entries))

    async def _notices_from_now(self) -> None:
        """The reader takes the notices sent from now on: the log has the frames of those before (a
        stream's replay at start, `_poll_log` after an outage)."""
        with contextlib.suppress(*_ERRORS):
            async with asyncio.timeout(5):
                last: Any = await self._reader.xrevrange(self._notice_key, count=1)
            self._notice_last = str(last[0][0]) if last else "0-0"

    async def _until_connected(self) -> None:
        """Redis is away: poll the log until it answers, then catch up once more from the log."""
        while True:
            await self._poll_log()
            try:
                await asyncio.wait_for(self._reader.ping(), timeout=1.0)
            except _ERRORS:
                await asyncio.sleep(self._poll_interval)
                continue
            self._set_connected(True)
            await self._notices_from_now()
            await self._poll_log()
            return

    def _set_connected(self, connected: bool, exc: BaseException | None = None) -> None:
        if connected != self.connected:
            if connected and not self._was_connected:
                log.info("fan-out: reading and publishing events through Redis")
            elif connected:
                log.warning("fan-out: Redis answers; streams are live again")
            else:
                log.warning("fan-out: Redis unreachable (%s); streams poll the event log", exc)
        self._was_connected = self._was_connected or connected
        self.connected = connected
        redis_state(connected)

    async def _poll_log(self) -> None:
        """Every watched channel brought up to the log's head."""
        watched = self.broker.watched()
        if not watched:
            return
        try:
            heads = await self._load_heads(list(watched))
            for sid, head in heads.items():
                channel = self.broker.existing(sid)
                if channel is not None and head > channel.delivered_seq:
                    channel.deliver(await self._load_frames(sid, channel.delivered_seq, head + 1))
        except Exception:
            log.exception("fan-out: reading the event log failed; will retry")

    # --- holes -----------------------------------------------------------------------------------------

    def gap(self, channel: Channel) -> None:
        """The broker's `on_gap`: the channel holds frames after a hole; fill it from the log."""
        if channel.session_id not in self._filling and channel.subscribers:
            self._filling.add(channel.session_id)
            self._spawn(self._fill(channel), f"fanout-fill:{channel.session_id}")

    async def _fill(self, channel: Channel) -> None:
        sid = channel.session_id
        try:
            for _ in range(FILL_ATTEMPTS):
                if not channel.held or self.broker.existing(sid) is not channel:
                    return
                after = channel.delivered_seq
                frames = await self._load_frames(sid, after, min(channel.held))
                if frames and frames[0].seq == after + 1:
                    fanout_backfilled(len(frames))
                    channel.deliver(frames)
                    continue
                if frames:
                    break  # the log starts after the hole: retention pruned it
                await asyncio.sleep(0.05)
            if not channel.held or self.broker.existing(sid) is not channel:
                return
            log.warning("fan-out: events of session %s are no longer in the log; its streams resync", sid)
            self.broker.drop(sid)
        except Exception:
            log.exception("fan-out: filling a hole of session %s failed; its streams resume", sid)
            self.broker.drop(sid)
        finally:
            self._filling.discard(sid)

    # --- life ------------------------------------------------------------------------------------------

    def _spawn(self, work: Awaitable[None], name: str) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def start(self) -> None:
        try:
            await asyncio.wait_for(self._reader.ping(), timeout=2.0)
            self._set_connected(True)
            await self._notices_from_now()
            await asyncio.wait_for(self._publisher.connect(), timeout=2.0)
        except _ERRORS as exc:
            log.warning("fan-out: Redis unreachable at start (%s); streams poll the event log", exc)
        self._spawn(self._publish_loop(), "fanout-publish")
        self._spawn(self._read_loop(), "fanout-read")
        self._spawn(self._sweep_loop(), "fanout-sweep")

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # The last batch of the write-behind's final flush, once, without waiting on a Redis that is away.
        batch, self._outbox = self._outbox, []
        with contextlib.suppress(*_ERRORS):
            async with asyncio.timeout(1.0):
                await self._publish(batch)
                await self._publisher.drained()
        await self._publisher.close()
        await self._client.aclose()
        await self._reader.aclose()
