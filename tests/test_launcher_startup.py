"""What `python -m app` does before it serves: it loads the app with the garbage collector paused and turns
it back on after, and the app loads without what only the model layer needs (litellm, aiohttp), which
the layer imports in its own thread once the server serves."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import uvicorn

from app.__main__ import load_app
from tests.support.server import ROOT


@pytest.fixture
def freezes(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """`load_app`'s freezes, recorded (with whether the collector was on) instead of done: this test
    process's objects stay out of the permanent generation."""
    calls: list[bool] = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append(gc.isenabled()))
    return calls


def test_the_app_loads_with_the_collector_paused_then_frozen_and_on_again(freezes: list[bool]) -> None:
    config = uvicorn.Config("app.main:app", log_config=None)
    assert gc.isenabled()
    load_app(config)
    assert config.loaded
    assert freezes == [False]  # frozen before the collector ran again
    assert gc.isenabled()


def test_the_collector_is_on_again_when_the_app_fails_to_load(freezes: list[bool]) -> None:
    config = uvicorn.Config("tests.no_such_module:app", log_config=None)
    with pytest.raises(SystemExit):
        load_app(config)
    assert freezes == [False]
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off(freezes: list[bool]) -> None:
    gc.disable()
    try:
        load_app(uvicorn.Config("app.main:app", log_config=None))
        assert not gc.isenabled()
    finally:
        gc.enable()


_LOAD_SCRIPT = """
import json, sys
import uvicorn
from app.__main__ import load_app

load_app(uvicorn.Config("app.main:app", ws="none", log_config=None))
print(json.dumps(sorted(m for m in ("litellm", "aiohttp", "websockets") if m in sys.modules)))
"""


@pytest.mark.slow
@pytest.mark.processes
def test_the_app_loads_without_the_model_layers_libraries(tmp_path: Path) -> None:
    """They cost seconds of imports that /healthz would wait for (litellm) or ~0.1 s (aiohttp)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")}
    env["PARLEY_DATABASE_URL"] = f"sqlite+aiosqlite:///{tmp_path / 'unused.db'}"
    done = subprocess.run(
        [sys.executable, "-c", _LOAD_SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
