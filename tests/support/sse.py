"""An SSE subscriber for tests: reads a session's stream in a task and lets the test wait for events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_sse import aconnect_sse


@dataclass
class Received:
    id: str
    event: str
    data: dict[str, Any]


@dataclass
class EventReader:
    client: httpx.AsyncClient
    url: str
    events: list[Received] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None
    _open: asyncio.Event = field(default_factory=asyncio.Event)
    headers: dict[str, str] = field(default_factory=dict)
    retry: int | None = None

    async def __aenter__(self) -> EventReader:
        self._task = asyncio.create_task(self._read())
        await asyncio.wait_for(self._open.wait(), 10)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _read(self) -> None:
        async with aconnect_sse(self.client, "GET", self.url, headers=self.headers, timeout=None) as source:
            source.response.raise_for_status()
            self._open.set()
            async for sse in source.aiter_sse():
                if sse.retry is not None:
                    self.retry = sse.retry
                if not sse.data:  # the stream's first frame only sets the reconnection delay
                    continue
                self.events.append(Received(sse.id, sse.event, json.loads(sse.data)))
                self._changed.set()

    def of_type(self, *types: str) -> list[dict[str, Any]]:
        return [e.data for e in self.events if e.event in types]

    async def wait_for(
        self, predicate: Callable[[Received], bool], *, count: int = 1, timeout: float = 20.0
    ) -> list[Received]:
        async def matched() -> list[Received]:
            while True:
                found = [e for e in self.events if predicate(e)]
                if len(found) >= count:
                    return found
                if self._task is not None and self._task.done():
                    exc = self._task.exception()
                    raise AssertionError(
                        f"the stream ended: {exc!r}; received {[e.event for e in self.events]}"
                    )
                self._changed.clear()
                await self._changed.wait()

        return await asyncio.wait_for(matched(), timeout)

    async def wait_type(self, event: str, *, count: int = 1, timeout: float = 20.0) -> list[Received]:
        return await self.wait_for(lambda e: e.event == event, count=count, timeout=timeout)
