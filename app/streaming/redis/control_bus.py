"""Control across replicas: a Redis pub/sub channel every replica listens on (one subscriber each), for
requests that must reach whichever replica runs a session's turn (a cancel, a delete) and for notices
every replica acts on (a session deleted).

A request is broadcast with an id and this replica's reply channel; the replica that can act on it
answers there, the others stay silent. Pub/sub has no memory: a replica that is away misses the
request, so a request is fast, never durable. `request` then returns None after its timeout and the
caller falls back to what the database says (the durable side, e.g. a cancel flag on the turn row, is
the turn owner's lease to read).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import RedisError

from app.streaming.redis.relay import redis_client

log = logging.getLogger(__name__)

# What a replica does with a request or notice: (op, session_id, args) -> its answer, or None to stay
# silent (it cannot act on it: another replica will).
Handler = Callable[[str, str, dict[str, Any]], Awaitable[dict[str, Any] | None]]

RECONNECT_SECONDS = 0.5
# Seconds a broadcast may take before it counts as Redis being unreachable.
PUBLISH_TIMEOUT = 5.0
_ERRORS = (RedisError, OSError, TimeoutError)


class ControlBus:
    def __init__(self, url: str, prefix: str, handler: Handler | None = None) -> None:
        """`handler` answers the requests of other replicas (None: this bus only asks)."""
        self.replica_id = uuid.uuid4().hex
        # Timeouts are the callers' own (PUBLISH_TIMEOUT): with a socket timeout redis-py sends each command
        # from a task of its own, a loop turn later, and a stop sent elsewhere would wait for it.
        self._client = redis_client(url, socket_timeout=None, client_name=f"{prefix}:control")
        self._prefix = prefix
        self._channel = f"{prefix}:control"
        self._reply_channel = f"{prefix}:reply:{self.replica_id}"
        self._handler = handler
        self._replies: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._listening = asyncio.Event()

    async def request(
        self, op: str, session_id: str, args: dict[str, Any], *, timeout: float
    ) -> dict[str, Any] | None:
        """The answer of the replica that acted on it, or None if none did within `timeout` (or Redis is
        away)."""
        request_id = uuid.uuid4().hex
        reply: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[request_id] = reply
        try:
            if not await self._publish(op, session_id, args, request_id):
                return None
            async with asyncio.timeout(timeout):
                return await reply
        except TimeoutError:
            return None
        finally:
            self._replies.pop(request_id, None)

    async def notify(self, op: str, session_id: str, args: dict[str, Any]) -> None:
        """Tells every other replica; nobody answers."""
        await self._publish(op, session_id, args, None)

    async def _publish(self, op: str, session_id: str, args: dict[str, Any], request_id: str | None) -> bool:
        message = {
            "op": op,
            "session_id": session_id,
            "args": args,
            "id": request_id,
            "from": self.replica_id,
        }
        try:
            async with asyncio.timeout(PUBLISH_TIMEOUT):
                await self._client.publish(self._channel, json.dumps(message))
        except _ERRORS as exc:
            log.warning("control: Redis unreachable (%s); %s of %s not broadcast", exc, op, session_id)
            return False
        return True

    async def _listen(self) -> None:
        while True:
            pubsub = self._client.pubsub()
            try:
                await pubsub.subscribe(self._channel, self._reply_channel)
                self._listening.set()
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
                    if message is not None:
                        self._received(message["channel"], message["data"])
            except _ERRORS as exc:
                log.warning("control: listening failed (%s); resubscribing", exc)
                await asyncio.sleep(RECONNECT_SECONDS)
            finally:
                await pubsub.aclose()  # type: ignore[no-untyped-call]

    def _received(self, channel: str, data: str) -> None:
        try:
            message = json.loads(data)
        except ValueError:
            return
        if channel == self._reply_channel:
            reply = self._replies.get(message.get("id"))
            if reply is not None and not reply.done():
                reply.set_result(message.get("answer") or {})
        elif message.get("from") != self.replica_id:
            self._spawn(self._act(message))

    async def _act(self, message: dict[str, Any]) -> None:
        if self._handler is None:
            return
        try:
            answer = await self._handler(message["op"], message["session_id"], message.get("args") or {})
        except Exception:
            log.exception("control: %s of session %s failed here", message["op"], message["session_id"])
            return
        if answer is not None and message.get("id"):
            reply = {"id": message["id"], "answer": answer}
            try:
                async with asyncio.timeout(PUBLISH_TIMEOUT):
                    await self._client.publish(f"{self._prefix}:reply:{message['from']}", json.dumps(reply))
            except _ERRORS as exc:
                log.warning("control: the answer to %s could not be sent (%s)", message["op"], exc)

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def start(self) -> None:
        """Listens; returns once subscribed (or after a second if Redis is away: it keeps trying)."""
        self._spawn(self._listen())
        try:
            async with asyncio.timeout(1.0):
                await self._listening.wait()
        except TimeoutError:
            log.warning("control: Redis unreachable at start; cancels from other replicas wait for it")

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._client.aclose()
