"""bench.compare runs the same stages alternately for two revisions and prints them side by side; here with
the smoke's demo stage (tiny sizes: its figures mean nothing), this checkout against HEAD's worktree."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.compare import HEADER, rows

ROOT = Path(__file__).resolve().parents[2]


def test_rows_of_a_run_hold_each_sweep_level_beside_the_raw_sdk_and_the_demo() -> None:
    results = json.loads((ROOT / "bench" / "results" / "latest.json").read_text(encoding="utf-8"))
    table = rows("x", 1, results)
    sweep = results["sweep"]["auto"]["levels"]
    openai = {level["concurrency"]: level for level in results["baselines"]["openai"]["levels"]}
    assert len(table) == len(sweep) + len(results["demo"]["levels"])
    for line, level in zip(table, sweep, strict=False):
        added = level["first_text_added_ms"]["p50"]
        raw = openai[level["concurrency"]]["first_text_added_ms"]["p50"]
        cpu = level["cpu_per_chunk_us"]
        assert line == f"| x | 1 | sweep {level['concurrency']} | {added} ms | {raw} ms | {cpu} µs/chunk |"
    assert all(line.count("|") == HEADER[0].count("|") for line in table)


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.serial
def test_two_revisions_run_alternately_and_their_worktree_goes() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.compare",
            "--rounds",
            "1",
            ".",
            "HEAD",
            "--",
            "--smoke",
            "--only",
            "demo",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    table = done.stdout[done.stdout.index(HEADER[0]) :].splitlines()
    assert table[:2] == HEADER
    assert [line.split(" | ")[0] for line in table[2:]] == ["| .", "| HEAD"]
    assert all(re.search(r"\| [0-9.]+ µs/token \|$", line) for line in table[2:])
    worktrees = subprocess.run(
        ["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "bench/work/compare" not in worktrees.stdout
