"""Resume with `after` and Last-Event-ID: every event after the position, then live, no gap, no duplicate."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from tests.support.client import LONG, new_session, post
from tests.support.server import LiveServer
from tests.support.stream import StreamClient, assert_contiguous

pytestmark = pytest.mark.anyio


@pytest.mark.both_backends
async def test_after_and_the_header_resume_mid_turn_and_the_header_wins(paced: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=paced.base_url, timeout=30) as client:
        sid = await new_session(client)
        full = StreamClient(client, sid)
        opened = asyncio.Event()
        reading = asyncio.create_task(full.read(lambda f: f.event == "turn_done", seconds=30, opened=opened))
        await opened.wait()
        await post(client, sid, LONG)
        await full.wait(lambda frames: len(frames) >= 40)
        mark = full.frames[20].id
        seen_at_resume = len(full.frames)

        by_after = StreamClient(client, sid)
        by_header = StreamClient(client, sid)
        await asyncio.gather(
            by_after.read_until_type("turn_done", params={"after": str(mark)}),
            # A reconnecting EventSource keeps its URL's `after` and sends the newer header: the header wins.
            by_header.read_until_type(
                "turn_done", params={"after": "1"}, headers={"Last-Event-ID": str(mark + 5)}
            ),
        )
        assert await reading == "matched"

    assert_contiguous(full.frames)
    assert "turn_done" not in full.types()[:seen_at_resume]  # the resume happened mid-turn
    assert by_after.frames == full.frames[mark:]  # ids start at 1: full.frames[mark] has id mark + 1
    assert by_header.frames == full.frames[mark + 5 :]
    assert by_after.retry == by_header.retry == full.retry == paced.settings.sse_retry_ms


@pytest.mark.both_backends
async def test_reconnecting_at_random_moments_loses_and_repeats_nothing(paced: LiveServer) -> None:
    rng = random.Random(20261122)
    async with httpx.AsyncClient(base_url=paced.base_url, timeout=30) as client:
        sid = await new_session(client)
        full = StreamClient(client, sid)
        opened = asyncio.Event()

        reading = asyncio.create_task(full.read(full.turns_done(1), seconds=40, opened=opened))
        await opened.wait()
        await post(client, sid, LONG)

        hopper = StreamClient(client, sid)
        outcome = await hopper.read(seconds=rng.uniform(0.005, 0.15), params={"after": "0"})
        while outcome != "matched":
            assert hopper.connects < 200
            # Until it has seen an id, the client resumes from where it started, as EventSource does
            # with its URL; a busy machine may not deliver anything within the first short read.
            start = {"after": "0"} if hopper.last_id is None else None
            outcome = await hopper.read(hopper.turns_done(1), seconds=rng.uniform(0.005, 0.15), params=start)
        assert await reading == "matched"

    assert hopper.connects >= 15, hopper.connects
    assert_contiguous(hopper.frames)
    assert hopper.frames == full.frames  # same ids, same bytes


async def test_a_position_newer_than_the_log_starts_with_a_resync(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = await new_session(client)
        first = StreamClient(client, sid)
        opened = asyncio.Event()
        reading = asyncio.create_task(first.read_until_type("turn_done", opened=opened))
        await opened.wait()
        await post(client, sid, "hello")
        await reading
        head = first.last_id
        assert head is not None

        for position in (str(head + 1), "9" * 40):
            ahead = StreamClient(client, sid)
            opened = asyncio.Event()
            reading = asyncio.create_task(
                ahead.read_until_type("turn_done", headers={"Last-Event-ID": position}, opened=opened)
            )
            await opened.wait()
            await post(client, sid, "again")
            await reading
            resync, *rest = ahead.frames
            assert (resync.event, resync.id) == ("resync", head)
            assert resync.payload == {
                "type": "resync",
                "seq": head,
                "session_id": sid,
                "last_event_id": head,
                "reason": "unknown",
            }
            assert_contiguous(rest, head + 1)
            head = ahead.last_id
            assert head is not None


async def test_no_position_or_an_empty_header_starts_live(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = await new_session(client)
        warmup = StreamClient(client, sid)
        opened = asyncio.Event()
        reading = asyncio.create_task(warmup.read_until_type("turn_done", opened=opened))
        await opened.wait()
        await post(client, sid, "hello")
        await reading
        assert warmup.last_id is not None

        live = StreamClient(client, sid)
        opened = asyncio.Event()
        reading = asyncio.create_task(
            live.read_until_type("turn_done", headers={"Last-Event-ID": ""}, opened=opened)
        )
        await opened.wait()
        await post(client, sid, "again")
        await reading
        assert_contiguous(live.frames, warmup.last_id + 1)
        assert live.frames[0].event == "turn_start"


@pytest.mark.parametrize("position", ["-1", "abc", "1.5", " 3", "3 ", "+3", "0x10", "1e3", "١٢", ""])
async def test_a_malformed_after_is_a_422(server: LiveServer, position: str) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = await new_session(client)
        response = await client.get(f"/v1/sessions/{sid}/events", params={"after": position})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "validation_error"
    assert [detail["field"] for detail in error["details"]] == ["query.after"]


# Header values cannot start or end with blanks on the wire, and are bytes, not text.
@pytest.mark.parametrize("position", ["-1", "abc", "1.5", "+3", "0x10", "1e3", "3,4"])
async def test_a_malformed_last_event_id_is_a_422_even_with_a_valid_after(
    server: LiveServer, position: str
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        sid = await new_session(client)
        response = await client.get(
            f"/v1/sessions/{sid}/events", params={"after": "0"}, headers={"Last-Event-ID": position}
        )
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "validation_error"
    assert [detail["field"] for detail in error["details"]] == ["header.Last-Event-ID"]


async def test_an_unknown_session_is_a_404_before_the_position_is_used(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        response = await client.get("/v1/sessions/s_nope/events", params={"after": "3"})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
