"""A resuming SSE client for tests: what a browser's EventSource does, with the test choosing when it drops.

`StreamClient.read` connects (sending Last-Event-ID once it has seen an id, like EventSource), keeps every
frame exactly as received, and returns why it stopped: the predicate matched, the time was up (the client
hung up), or the server ended the stream or the connection.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
from httpx_sse import aconnect_sse

Outcome = Literal["matched", "timeout", "ended", "broken"]


@dataclass(frozen=True)
class Frame:
    id: int
    event: str
    data: str

    @property
    def payload(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.data)
        return loaded


@dataclass
class StreamClient:
    client: httpx.AsyncClient
    session_id: str
    frames: list[Frame] = field(default_factory=list)
    retry: int | None = None
    connects: int = 0
    last_status: int | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        return f"/v1/sessions/{self.session_id}/events"

    @property
    def last_id(self) -> int | None:
        return self.frames[-1].id if self.frames else None

    def types(self) -> list[str]:
        return [f.event for f in self.frames]

    def turns_done(self, count: int) -> Callable[[Frame], bool]:
        """A read's `until`: the stream has shown `count` turn_done events in all."""
        return lambda _: self.types().count("turn_done") >= count

    def of_type(self, event: str) -> list[dict[str, Any]]:
        return [f.payload for f in self.frames if f.event == event]

    async def read(
        self,
        until: Callable[[Frame], bool] | None = None,
        *,
        seconds: float | None = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        opened: asyncio.Event | None = None,
    ) -> Outcome:
        """One connection: reads until `until` matches a frame, `seconds` pass, or the stream ends."""
        sent = dict(headers or {})
        if self.last_id is not None and headers is None:
            sent["Last-Event-ID"] = str(self.last_id)
        self.connects += 1
        matched = False

        async def consume() -> Outcome:
            nonlocal matched
            async with aconnect_sse(
                self.client, "GET", self.url, params=params, headers=sent, timeout=None
            ) as source:
                self.last_status = source.response.status_code
                source.response.raise_for_status()
                if opened is not None:
                    opened.set()
                async for sse in source.aiter_sse():
                    if sse.retry is not None:
                        self.retry = sse.retry
                    if not sse.data:
                        continue
                    frame = Frame(int(sse.id), sse.event, sse.data)
                    self.frames.append(frame)
                    self._changed.set()
                    if until is not None and until(frame):
                        matched = True
                        return "matched"
            return "ended"

        try:
            if seconds is None:
                return await consume()
            return await asyncio.wait_for(consume(), seconds)
        except TimeoutError:
            # The time may run out while the connection closes after a match.
            return "matched" if matched else "timeout"
        except (httpx.RemoteProtocolError, httpx.ReadError):
            return "matched" if matched else "broken"

    async def wait(self, predicate: Callable[[list[Frame]], bool], seconds: float = 20.0) -> None:
        """Waits, while another task reads, until the frames so far satisfy `predicate`."""
        async with asyncio.timeout(seconds):
            while not predicate(self.frames):
                self._changed.clear()
                await self._changed.wait()

    async def read_until_type(self, event: str, *, seconds: float = 30.0, **kwargs: Any) -> Outcome:
        outcome = await self.read(lambda f: f.event == event, seconds=seconds, **kwargs)
        assert outcome == "matched", f"no {event} within {seconds} s: {outcome}; got {self.types()[-8:]}"
        return outcome


def assert_contiguous(frames: Sequence[Frame], first: int = 1) -> None:
    """Ids first, first+1, ...: nothing missing, nothing twice, in order."""
    ids = [f.id for f in frames]
    expected = list(range(first, first + len(ids)))
    if ids != expected:
        missing = sorted(set(expected) - set(ids))
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        raise AssertionError(f"not contiguous from {first}: missing {missing[:10]}, repeated {repeated[:10]}")
