"""The report side of the harness, fast: figures, latest.json/md and the plot rebuilt from the committed
full run (bench/results/latest.json, read only), so that a change to figures.py, report.py, plot.py or
the run's totals that breaks on a real document fails here in a second, not only in the smoke run."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from bench.context import Context
from bench.figures import FIGURE_KEYS, build
from bench.plan import STAGES, config_from, parser
from bench.plot import plot
from bench.replica_report import markdown
from bench.report import write
from bench.run import _peak, _turn_errors, default_out

COMMITTED = Path(__file__).resolve().parents[2] / "bench" / "results" / "latest.json"


@pytest.fixture
def results() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(COMMITTED.read_text(encoding="utf-8"))
    document.pop("figures")
    return document


def test_every_figure_is_built_from_a_full_run(results: dict[str, Any]) -> None:
    figures = build(results)
    assert [figure.key for figure in figures] == list(FIGURE_KEYS)
    # The committed run measured every stage: a None means a figure no longer finds its data. (Its
    # PostgreSQL, tool and replica figures come with the first full run that has those stages.)
    missing = [figure.key for figure in figures if figure.value is None]
    newer = [("postgres", "postgres_"), ("tools", "tool_"), ("replicas", "replicas_"), ("burst", "burst_")]
    newer.append(("compaction", "compaction_"))
    for stage, prefix in newer:  # stages newer than the committed run
        if stage not in results:
            missing = [key for key in missing if not key.startswith(prefix)]
    if "anthropic" not in (results.get("sweep") or {}):  # the Anthropic path is newer than it too
        missing = [key for key in missing if "anthropic" not in key]
    assert missing == []


def test_run_totals_match_the_committed_run(results: dict[str, Any]) -> None:
    ctx = cast(Context, SimpleNamespace(server_peaks=results["server_peaks_mb"]))
    assert _turn_errors(results) == results["turn_errors"]
    assert _peak(ctx, results) == results["peak_rss_mb"]


def test_report_and_plot_render(results: dict[str, Any], tmp_path: Path) -> None:
    figures = build(results)
    write(tmp_path, results, figures)
    plot(results, tmp_path / "latest.png")

    document = json.loads((tmp_path / "latest.json").read_text(encoding="utf-8"))
    assert [figure["key"] for figure in document["figures"]] == list(FIGURE_KEYS)
    summary = (tmp_path / "latest.md").read_text(encoding="utf-8")
    assert all(figure.name in summary for figure in figures)
    assert "## Concurrency sweep" in summary
    assert (tmp_path / "latest.png").read_bytes().startswith(b"\x89PNG")


def test_the_replica_table_shows_where_a_turns_extra_time_goes(results: dict[str, Any]) -> None:
    """Each capacity level's row ends with the p50 of POST → 202, POST → upstream request, the first
    token added and upstream end → turn_done; a figure a run predates shows as –."""
    run = results["replicas"]
    level = run["one"]["levels"][0]
    phases = ("post_to_request_ms", "first_text_added_ms", "end_to_done_ms")
    rest = " / ".join(f"{level[key]['p50']:.0f}" for key in phases)
    measured = {**level, "post_to_accepted_ms": {"p50": 26.7}}
    predating = {key: value for key, value in level.items() if key != "post_to_accepted_ms"}
    table = markdown({**run, "one": {"levels": [measured]}, "two": {"levels": [predating]}})
    rows = [line for line in table.splitlines() if line.startswith("| 1 |")]
    assert len(rows) == 2
    assert f"| 27 / {rest} |" in rows[0]
    assert f"| – / {rest} |" in rows[1]


@pytest.mark.parametrize(
    ("argv", "committed"),
    [
        ([], True),
        (["--levels", "10,50"], True),
        (["--render-only"], True),
        (["--smoke"], False),
        (["--only", "sweep"], False),
        (["--skip", "replicas"], False),
        (["--only", ",".join(reversed(STAGES))], True),
    ],
)
def test_only_a_full_run_writes_the_committed_figures(
    argv: list[str], committed: bool, tmp_path: Path
) -> None:
    args = parser().parse_args(argv)
    out = default_out(config_from(args), tmp_path, render_only=args.render_only)
    assert out == (COMMITTED.parent if committed else tmp_path / "results")
