"""A benchmark run stopped by SIGTERM (a CI job cancelled, `timeout`, `kill`) stops the servers and the
fake upstream it started, as Ctrl-C does: left running, they loaded every later run on the machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# A benchmark run starts servers and an upstream: several processes, alone on the machine.
pytestmark = [pytest.mark.slow, pytest.mark.processes, pytest.mark.serial]

ROOT = Path(__file__).resolve().parents[2]


def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    return [int(line) for line in found.stdout.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_stops_the_servers_the_run_started(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "bench.run", "--smoke", "--only", "sweep"]
    command += ["--out", str(tmp_path / "results"), "--work", str(tmp_path / "work")]
    run = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        # The fake upstream, then a server: both started, the run is inside its stage.
        while len(children := _children(run.pid)) < 2:
            assert run.poll() is None, "the run ended before it started its server"
            assert time.monotonic() < deadline, "no server started within 60 s"
            time.sleep(0.05)
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=60)
        deadline = time.monotonic() + 10
        while (left := [pid for pid in children if _alive(pid)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert left == [], f"left running: {left}"
    finally:
        for pid in _children(run.pid):
            os.kill(pid, signal.SIGKILL)
        if run.poll() is None:
            run.kill()
