"""The reference page in Debian's chromium, driven by Playwright's Python package (never `playwright
install`: it downloads a browser). `make browser-deps` installs chromium with apt-get where it can.

Without /usr/bin/chromium the browser tests are skipped with one line; under CI=true that skip is a failure.
The server is a real process (`python -m uvicorn app.main:app`), with a key, so that kill -9 is real.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.process import ServerProcess
from tests.support.server import migrate

CHROMIUM = Path(os.environ.get("PARLEY_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
KEY = "browser-test-key-0123456789abcdef"
# PARLEY_UPDATE_SCREENSHOTS=1 writes the screenshots docs/frontend.md shows; otherwise they go to the
# test's tmp.
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Module-scoped on purpose: Playwright's sync API keeps an event loop marked running in the main thread
    until it stops, and anyio's test runner cannot start one while it is (every async test after the browser
    module failed with "Cannot run the event loop while another loop is running")."""
    if not CHROMIUM.exists():
        line = f"browser tests skipped: {CHROMIUM} is missing (make browser-deps installs it as root)"
        if os.environ.get("CI") == "true":
            pytest.fail(line + "; CI=true makes that a failure")
        pytest.skip(line)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def parley(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the module (each test works in sessions of its own): a start costs seconds of CPU,
    and the kill -9 test restarts it on the same port and database, as a deployment would."""
    directory = tmp_path_factory.mktemp("browser")
    database_url = f"sqlite+aiosqlite:///{directory / 'parley.db'}"
    migrate(database_url)
    env = {
        "PARLEY_DATABASE_URL": database_url,
        "PARLEY_API_KEYS": f"alice:{KEY}",
        "PARLEY_DEMO_TOKEN_DELAY": "0.02",
        "PARLEY_SSE_RETRY_MS": "300",
    }
    server = ServerProcess(env, directory / "server.log")
    server.start(timeout=90)
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    if os.environ.get("PARLEY_UPDATE_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        return SCREENSHOTS
    return tmp_path
