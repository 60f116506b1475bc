"""The benchmark harness keeps working: `python -m bench.run --smoke` runs every stage with tiny sizes.

Benchmarks, not timed tests: nothing here looks at how fast anything was (a CI machine is noisy, and the
figures of a smoke run mean nothing). It checks that every stage ran, that latest.json holds every
figure of bench.figures.FIGURE_KEYS with a value, its unit, target and comparisons, and that the
markdown summary and the plot were written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from bench.figures import FIGURE_KEYS
from tests.support.postgres import unreachable_reason
from tests.support.redis import REDIS_URL

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.processes, pytest.mark.serial]


def test_smoke_run_reports_every_figure(tmp_path: Path) -> None:
    out, work = tmp_path / "results", tmp_path / "work"
    command = [sys.executable, "-m", "bench.run", "--smoke", "--out", str(out), "--work", str(work)]
    # The postgres stage needs a PostgreSQL (tests/support/postgres.py), the replicas stage PostgreSQL and
    # Redis: without them they are left out here, except under CI=true, where the run then fails as the
    # other PostgreSQL and Redis tests do.
    local = os.environ.get("CI") != "true"
    postgres_away = unreachable_reason() is not None and local
    redis_away = _redis_unreachable() and local
    skipped = ["postgres"] if postgres_away else []
    skipped += ["replicas"] if postgres_away or redis_away else []
    if skipped:
        command += ["--skip", ",".join(skipped)]
    # The replicas stage finds its Redis as the tests do.
    env = {**os.environ, "PARLEY_BENCH_REDIS_URL": REDIS_URL}
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=420, check=False
    )
    assert done.returncode == 0, done.stderr[-6000:]

    document = json.loads((out / "latest.json").read_text(encoding="utf-8"))
    assert document["errors"] == []
    # Every turn and baseline stream completed: a stage that runs but loses turns is broken too.
    assert document["turn_errors"] == 0
    assert document["config"]["smoke"] is True
    figures = {figure["key"]: figure for figure in document["figures"]}
    assert set(FIGURE_KEYS) <= set(figures)
    for key in FIGURE_KEYS:
        figure = figures[key]
        assert {"name", "unit", "target", "passed", "baselines", "peers", "ratios", "note"} <= set(figure)
        # Produced, whatever its value: a None here means a stage measured nothing.
        if not any(key.startswith(f"{stage}_") for stage in skipped):
            assert figure["value"] is not None, key
    for field in ("cores", "cpu_model", "python", "litellm", "git_commit", "date"):
        assert field in document["machine"]
    assert set(document["sweep"]) == {"auto", "litellm", "anthropic"}
    assert set(document["baselines"]) == {"litellm", "openai"}
    # The burst timed every turn through the server and every direct request to the upstream.
    burst = document["burst"]
    expected = burst["sessions"] * len(burst["rounds"])
    assert burst["server"]["first_text_ms"]["n"] == burst["raw"]["first_text_ms"]["n"] == expected > 0

    if "replicas" not in skipped:
        # Both capacity searches measured levels, and the streams on the other replica missed nothing.
        assert document["replicas"]["one"]["levels"] and document["replicas"]["two"]["levels"]
        assert document["replicas"]["delivery"]["missing"] == 0

    summary = (out / "latest.md").read_text(encoding="utf-8")
    assert all(figure["name"] in summary for figure in figures.values())
    assert (out / "latest.png").read_bytes().startswith(b"\x89PNG")


def _redis_unreachable() -> bool:
    try:
        with redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2) as client:
            client.ping()
    except (redis.RedisError, OSError):
        return True
    return False
