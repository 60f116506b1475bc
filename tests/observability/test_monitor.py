"""The benchmark's debug statistics (app.observability.monitor): the percentile and window arithmetic, which
work a commit is counted for, and the commit counter on a real engine."""

from __future__ import annotations

import asyncio

import pytest

from app.observability.monitor import CommitCounter, commit_origin, max_in_window, percentile
from app.protocol.events import AgentStatus
from app.storage.engine import Database
from app.storage.tables import ChatSessionRow
from app.streaming.log.write_behind import WriteBehind

T0 = "2026-02-28T06:30:00.000+00:00"


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([], 50, None),
        ([7.0], 99, 7.0),
        ([4.0, 1.0, 3.0, 2.0], 50, 2.5),  # unsorted; halfway between the middle two
        ([4.0, 1.0, 3.0, 2.0], 0, 1.0),
        ([4.0, 1.0, 3.0, 2.0], 100, 4.0),
        ([float(n) for n in range(101)], 99, 99.0),
        ([0.0, 10.0], 25, 2.5),
    ],
)
def test_percentile_interpolates_between_closest_ranks(
    values: list[float], q: float, expected: float
) -> None:
    assert percentile(values, q) == expected


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        ([], 0),
        ([5.0], 1),
        ([0.0, 0.25, 0.5, 0.75], 2),  # half-open: 0.5 is not in [0, 0.5)
        ([2.0, 0.0, 0.25, 0.125], 3),  # unsorted
        ([1.0, 1.0, 1.0], 3),
    ],
)
def test_max_in_window_counts_the_fullest_half_open_window(times: list[float], expected: int) -> None:
    assert max_in_window(times, 0.5) == expected


def test_commit_origin_outside_an_event_loop_is_other() -> None:
    assert commit_origin() == "other"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("task_name", "origin"),
    [
        ("write-behind", "batch"),
        ("write-behind:urgent", "urgent"),
        ("turn:t_000000000001", "turn"),
        ("Task-7", "request"),
        ("turns", "request"),
    ],
)
async def test_commit_origin_goes_by_the_task_name(task_name: str, origin: str) -> None:
    async def origin_in_task() -> str:
        return commit_origin()

    assert await asyncio.create_task(origin_in_task(), name=task_name) == origin


@pytest.mark.anyio
async def test_the_commit_counter_counts_each_commit_of_the_engine_by_origin(database_url: str) -> None:
    database = Database(database_url)
    counter = CommitCounter()
    counter.attach(database.engine)
    n = 0

    async def request_commit() -> None:
        nonlocal n
        n += 1
        async with database.session() as db:
            db.add(ChatSessionRow(id=f"s_{n}", model="parley/demo", tools=[], created_at=T0, updated_at=T0))
            await db.commit()

    writer = WriteBehind(database)
    writer.start()  # its batches commit in the task named "write-behind" (or "write-behind:urgent")
    try:
        await request_commit()
        await asyncio.create_task(request_commit(), name="turn:t_000000000001")
        events = writer.publisher("s_1")
        events.text_delta("m_1", "Hi")  # a delta: an interval batch
        deadline = asyncio.get_running_loop().time() + 5
        while writer.batch_commits == 0:
            assert asyncio.get_running_loop().time() < deadline, "no batch committed"
            await asyncio.sleep(0.01)
        events.emit(AgentStatus, status="thinking")  # published outside a turn's write: an urgent batch
        while writer.urgent_commits == 0:
            assert asyncio.get_running_loop().time() < deadline, "no urgent batch committed"
            await asyncio.sleep(0.01)
        snapshot = counter.snapshot(window=60.0)
        origins = {"batch": 1, "request": 1, "turn": 1, "urgent": 1}
        assert (snapshot["total"], snapshot["by_origin"]) == (4, origins)
        assert snapshot["max_per_window"] == 4
        assert snapshot["max_per_window_by_origin"] == origins

        counter.reset()
        counter.detach()
        await request_commit()
        assert (counter.total, list(counter.commits)) == (0, [])
    finally:
        await writer.stop()
        await database.dispose()
