"""With PROMETHEUS_MULTIPROC_DIR, a scrape of any worker process adds up every worker's values
(prometheus-client's multiprocess mode, which docs/deployment.md promises for several workers). How it
proves it: two real processes each count a turn, a third renders the scrape, and the counts and the
histogram add up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.server import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.processes]

WORKER = """
from app.observability import hooks
from app.observability.metrics import Metrics
hooks.activate(Metrics())
with hooks.observe_turn("s_1", "t_1", "parley/demo") as turn:
    turn.status = "completed"
"""
SCRAPE = """
from app.observability.metrics import Metrics
print(Metrics().render()[0].decode())
"""


def _python(code: str, directory: Path) -> str:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_scrape_adds_up_every_workers_values(tmp_path: Path) -> None:
    _python(WORKER, tmp_path)
    _python(WORKER, tmp_path)
    text = _python(SCRAPE, tmp_path)
    assert "parley_turns_started_total 2.0" in text
    assert 'parley_turns_ended_total{status="completed"} 2.0' in text
    assert 'parley_turn_duration_seconds_count{status="completed"} 2.0' in text
