"""A session of the interrupt tests, driven over a real socket, and what they check of the strict upstream.

The fixtures (the strict upstream, the settings that point the model at it, the live server with the
`slow` tool) are in tests/interrupt/conftest.py; the `slow` tool itself is tests/support/slow_tool.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from tests.fakes.upstream import FakeUpstream, RecordedRequest, validate_history
from tests.support.server import LiveServer
from tests.support.sse import EventReader, Received

TOOL_INTERRUPTED_BY_USER = "[Tool execution interrupted by user]"
INTERRUPTED_MARK = "[interrupted]"
# Generous bound for "the upstream saw the disconnect": unit tests never assert tight timings.
DISCONNECT_BOUND = 1.0


def assert_strictly_valid(upstream: FakeUpstream) -> None:
    """Every chat request the upstream received is a history a strict provider accepts."""
    for request in chat_requests(upstream):
        assert request.problems == [], request.problems
        assert validate_history(request.body["messages"]) == [], request.body["messages"]


def chat_requests(upstream: FakeUpstream) -> list[RecordedRequest]:
    return [r for r in upstream.requests if r.path == "/v1/chat/completions"]


def roles(messages: list[dict[str, Any]]) -> list[str]:
    return [m["role"] for m in messages]


@dataclass
class Session:
    """One session over a real socket, with its event stream read from before the first post."""

    client: httpx.AsyncClient
    id: str
    reader: EventReader

    @property
    def base(self) -> str:
        return f"/v1/sessions/{self.id}"

    async def post(self, content: str, delivery: str | None = None, **extra: Any) -> httpx.Response:
        body: dict[str, Any] = {"content": content, **extra}
        if delivery is not None:
            body["delivery"] = delivery
        return await self.client.post(f"{self.base}/messages", json=body)

    async def accepted(self, content: str, delivery: str | None = None) -> dict[str, Any]:
        response = await self.post(content, delivery)
        assert response.status_code == 202, response.text
        body: dict[str, Any] = response.json()
        return body

    async def cancel(self, clear_queue: bool | None = None) -> httpx.Response:
        if clear_queue is None:
            return await self.client.post(f"{self.base}/cancel")
        return await self.client.post(f"{self.base}/cancel", json={"clear_queue": clear_queue})

    async def queue(self) -> list[dict[str, Any]]:
        response = await self.client.get(f"{self.base}/queue")
        assert response.status_code == 200, response.text
        items: list[dict[str, Any]] = response.json()["queue"]
        return items

    async def withdraw(self, message_id: str) -> httpx.Response:
        return await self.client.delete(f"{self.base}/queue/{message_id}")

    async def history(self) -> list[dict[str, Any]]:
        response = await self.client.get(f"{self.base}/messages", params={"limit": 1000})
        assert response.status_code == 200, response.text
        page = response.json()
        assert page["next_cursor"] is None
        messages: list[dict[str, Any]] = page["chat_messages"]
        return messages

    async def info(self) -> dict[str, Any]:
        response = await self.client.get(self.base)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def user_texts(self) -> list[str]:
        return [m["content"] for m in await self.history() if m["type"] == "text" and m["role"] == "user"]

    # --- waiting on the stream -----------------------------------------------------------------------

    def events(self, *types: str) -> list[dict[str, Any]]:
        return self.reader.of_type(*types)

    def types(self) -> list[str]:
        return [e.event for e in self.reader.events]

    async def wait_type(self, event: str, *, count: int = 1, timeout: float = 10.0) -> list[Received]:
        return await self.reader.wait_type(event, count=count, timeout=timeout)

    async def turn_done(self, turn_id: str, timeout: float = 10.0) -> dict[str, Any]:
        [done] = await self.reader.wait_for(
            lambda e: e.event == "turn_done" and e.data["turn_id"] == turn_id, timeout=timeout
        )
        return done.data

    async def next_turn_after(self, turn_id: str, timeout: float = 10.0) -> str:
        """The turn_id of the first turn_start after `turn_id`'s turn_done."""
        await self.turn_done(turn_id, timeout)

        def after_done(e: Received) -> bool:
            return e.event == "turn_start" and _seq(e) > self._done_seq(turn_id)

        [start] = await self.reader.wait_for(after_done, timeout=timeout)
        return str(start.data["turn_id"])

    def _done_seq(self, turn_id: str) -> int:
        return next(
            _seq(e) for e in self.reader.events if e.event == "turn_done" and e.data["turn_id"] == turn_id
        )

    def turn_events(self, turn_id: str) -> list[Received]:
        """The events from `turn_id`'s turn_start to its turn_done (both included)."""
        out: list[Received] = []
        inside = False
        for e in self.reader.events:
            if e.event == "turn_start" and e.data["turn_id"] == turn_id:
                inside = True
            if inside:
                out.append(e)
            if e.event == "turn_done" and e.data["turn_id"] == turn_id:
                break
        return out

    async def is_idle(self) -> bool:
        """Idle, nothing waiting and every turn_start seen has its turn_done."""
        info = await self.info()
        starts, dones = len(self.events("turn_start")), len(self.events("turn_done"))
        return (
            info["agent_status"] == "idle"
            and info["running_turn_id"] is None
            and starts == dones
            and not await self.queue()
        )

    async def wait_idle(self, timeout: float = 10.0) -> None:
        """Idle, and still idle with no new event a moment later: events arrive in batches (every 50 ms),
        so a turn taken from the waiting line can be committed before its turn_start reaches us."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = len(self.reader.events)
            if await self.is_idle():
                await asyncio.sleep(0.15)
                if len(self.reader.events) == seen and await self.is_idle():
                    return
            await asyncio.sleep(0.02)
        raise AssertionError(
            f"the session never went idle: {await self.info()}, queue {await self.queue()}, "
            f"{len(self.events('turn_start'))} turn_start / {len(self.events('turn_done'))} turn_done; "
            f"events {self.types()[-30:]}"
        )


def _seq(e: Received) -> int:
    return int(e.id)


@asynccontextmanager
async def open_session(server: LiveServer, **create: Any) -> AsyncIterator[Session]:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        created = await client.post("/v1/sessions", json=create)
        assert created.status_code == 201, created.text
        sid = str(created.json()["id"])
        async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
            yield Session(client, sid, reader)


def assert_stop_events(session: Session, turn_id: str) -> dict[str, Any]:
    """A stopped turn ends with agent_status idle → agent_cancelled → turn_done(cancelled), once each."""
    events = session.turn_events(turn_id)
    types = [e.event for e in events]
    assert types.count("agent_cancelled") == 1, types
    assert types.count("turn_done") == 1, types
    assert types[-3:] == ["agent_status", "agent_cancelled", "turn_done"], types
    assert events[-3].data["status"] == "idle"
    cancelled = events[-2].data
    assert cancelled["turn_id"] == turn_id
    assert events[-1].data["status"] == "cancelled"
    seqs = [int(e.id) for e in events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "a turn's events are contiguous"
    return cancelled


async def disconnect_after(
    upstream: FakeUpstream, request: RecordedRequest, since: float, label: str
) -> float:
    """Waits until the upstream saw `request`'s client go away; returns and prints the time it took."""
    await upstream.await_request(lambda r: r is request and r.disconnected, within=5.0)
    assert request.disconnected_at is not None
    elapsed = request.disconnected_at - since
    print(f"\n[cancel→disconnect] {label}: {elapsed * 1000:.1f} ms")
    assert elapsed < DISCONNECT_BOUND, f"{label}: the upstream saw the disconnect only after {elapsed:.3f} s"
    return elapsed


async def request_number(upstream: FakeUpstream, n: int, within: float = 20.0) -> RecordedRequest:
    """The n-th (1-based) chat request, once it arrived. A bound, not a timing: the first LiteLLM turn of
    a test process waits for the LiteLLM child to start (3 to 5 s alone, more on a busy machine)."""
    await upstream.await_request(lambda _: len(chat_requests(upstream)) >= n, within=within)
    return chat_requests(upstream)[n - 1]
