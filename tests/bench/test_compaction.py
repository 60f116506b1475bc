"""bench.compaction: the planning of a long session is measured, turn after turn, as a turn does it; the
summaries it asks for come every several turns, not at every turn, and the figure is built."""

from __future__ import annotations

from bench.compaction import TARGET_MS, figures, measure


def test_a_long_session_is_planned_with_a_summary_every_several_turns() -> None:
    found = measure(turns=90, repeats=1, window=4000)
    assert found["turns"] == 90 and found["summaries"] >= 1
    # Folding goes down to half the budget: a summary call adds at most one model call in several turns.
    assert found["turns_per_summary"] >= 5
    assert 0 < found["last_turn_cpu_ms_p50"] <= found["turn_cpu_ms_p99"] * 10
    [figure] = figures({"compaction": found})
    assert figure.key == "compaction_planner_cpu_ms" and figure.target == TARGET_MS
    assert figure.value == found["last_turn_cpu_ms_p50"]
