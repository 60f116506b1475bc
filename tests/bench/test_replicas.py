"""The multi-replica stage's capacity search (bench/replicas.py), on levels whose outcome is known: the
search must land on the limit from either side, within its budget, and say when it found no limit."""

from __future__ import annotations

from typing import Any

import pytest

from bench.replicas import bounds, capacity

pytestmark = pytest.mark.anyio


def limited(limit: int, calls: list[int]) -> Any:
    """A measure of levels that pass up to `limit` sessions; records which levels were measured."""

    async def measure(sessions: int) -> dict[str, Any]:
        calls.append(sessions)
        return {"concurrency": sessions, "passed": sessions <= limit}

    return measure


async def test_stepping_up_then_halving_the_gap_finds_the_limit_from_below() -> None:
    calls: list[int] = []
    found = await capacity(limited(87, calls), start=40, step=20, budget=8)
    # 40, 60, 80 pass, 100 fails; then 90 (fails), 85 (passes): 85..90 is within a tenth of 85.
    assert calls == [40, 60, 80, 100, 90, 85]
    assert found["capacity"] == 85
    assert found["bounded"] is True
    assert [level["concurrency"] for level in found["levels"]] == sorted(calls)


async def test_a_failing_start_halves_until_a_level_passes_then_closes_in() -> None:
    calls: list[int] = []
    found = await capacity(limited(95, calls), start=160, step=40, budget=6)
    # 160 fails, 80 passes; then 120 and 100 fail, 90 and 95 pass, and the budget is spent.
    assert calls == [160, 80, 120, 100, 90, 95]
    assert found["capacity"] == 95
    assert found["bounded"] is True


async def test_the_search_stops_within_a_tenth_of_the_capacity() -> None:
    calls: list[int] = []
    found = await capacity(limited(52, calls), start=40, step=20, budget=20)
    # 40 passes, 60 fails; 50 passes, 55 fails, and 50..55 is within a tenth of 50: no further level.
    assert calls == [40, 60, 50, 55]
    assert found["capacity"] == 50


async def test_the_budget_bounds_the_levels_measured() -> None:
    calls: list[int] = []
    found = await capacity(limited(1000, calls), start=10, step=10, budget=3)
    assert calls == [10, 20, 30]
    # No level failed: 30 is a floor, which the report shows as "at least".
    assert found == {"capacity": 30, "bounded": False, "levels": found["levels"]}


async def test_nothing_passing_down_to_one_session_is_a_capacity_of_zero() -> None:
    calls: list[int] = []
    found = await capacity(limited(0, calls), start=3, step=2, budget=10)
    assert calls == [3, 1]
    assert found["capacity"] == 0 and found["bounded"] is True


def test_bounds_ignore_a_pass_above_the_lowest_failure() -> None:
    # A noisy machine can pass a level above one it failed: the capacity is below the first failure.
    tried = {40: {"passed": True}, 60: {"passed": False}, 80: {"passed": True}}
    assert bounds(tried) == (40, 60)
