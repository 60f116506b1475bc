"""bench/first_delta.py, tiny: every timed first delta is one urgent commit, delivered, and measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.first_delta import SESSIONS, measure

pytestmark = pytest.mark.anyio


async def test_each_first_delta_is_committed_at_once_and_delivered(tmp_path: Path) -> None:
    found = await measure(20, tmp_path)
    # The warm-up round's and the timed ones: each its own urgent commit and its one frame.
    assert found["urgent_commits"] == found["delivered"] == 20 + SESSIONS
    assert found["first_deltas"] == 20
    assert found["cpu_us"] > 0 and found["wall_us"] > 0
