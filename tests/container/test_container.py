"""The image, built and run with podman by shared/tools/container-smoke.sh, serves a whole demo turn.

Slow (a new machine first builds a python:3.11-slim stand-in, about 1.5 minutes; the image build takes
about a minute more unless podman's layer cache still holds it), so it runs in CI (CI=true) and when
PARLEY_CONTAINER_TEST=1, and is skipped otherwise.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT.parent / "shared" / "tools" / "container-smoke.sh"
IMAGE = "localhost/smoke-app:latest"  # the tag container-smoke.sh gives the image it builds

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("CI") != "true" and os.environ.get("PARLEY_CONTAINER_TEST") != "1",
        reason="builds and runs the image with podman: set PARLEY_CONTAINER_TEST=1 (CI=true runs it)",
    ),
]


def _drive_a_turn(*envs: str) -> None:
    """container-smoke.sh builds and starts the image with `envs`, then drive_turn runs a whole turn."""
    assert SMOKE.is_file(), f"{SMOKE} is missing: the container test needs shared/ beside the repository"
    # The image binds 0.0.0.0, so it serves only with keys (or PARLEY_ALLOW_OPEN=1): give it one.
    key = secrets.token_hex(24)
    options = [part for env in (f"PARLEY_API_KEYS=smoke:{key}", *envs) for part in ("--env", env)]
    smoke = subprocess.run(
        ["bash", str(SMOKE), *options, ".", "--", sys.executable, "-m", "tests.container.drive_turn"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PARLEY_SMOKE_KEY": key},
    )
    assert smoke.returncode == 0, f"container-smoke failed:\n{smoke.stdout}\n{smoke.stderr}"
    assert key not in smoke.stdout + smoke.stderr, "the API key was printed"
    assert "drive_turn:" in smoke.stdout, smoke.stdout


def test_the_container_serves_a_whole_turn() -> None:
    _drive_a_turn()

    inspected = subprocess.run(
        ["podman", "image", "inspect", IMAGE], capture_output=True, text=True, check=True
    )
    image = json.loads(inspected.stdout)[0]
    config = image["Config"]
    assert config["User"] == "10001:10001"
    assert "/data" in config["Volumes"]
    assert "/healthz" in " ".join(image["Healthcheck"]["Test"])
    assert "PARLEY_DATABASE_URL=sqlite+aiosqlite:////data/parley.db" in config["Env"]
