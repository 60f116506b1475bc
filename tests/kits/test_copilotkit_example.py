"""examples/copilotkit, CopilotKit's own packages on Parley: its runtime (server.mjs, an HttpAgent on
POST /v1/ag-ui) and its React `<CopilotChat>`, built and served by `vite preview`, in Debian's chromium
against a live server with the demo model and a key that only the runtime holds. The chat answers, shows
the tool call, and leaves the same session on Parley's own routes; a page reloaded mid-answer gets the
thread back from CopilotKit's runtime.

Opt-in: CopilotKit's packages are ~800 MB that `make test` and CI do not install. It runs with
PARLEY_COPILOTKIT_TEST=1 after `make copilotkit-example`; otherwise it is skipped with one line."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.settings import Settings
from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.support.server import LiveServer, free_port, live_server

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "copilotkit"
VITE = EXAMPLE / "node_modules" / "vite" / "bin" / "vite.js"
RUNTIME = EXAMPLE / "node_modules" / "@copilotkit" / "runtime" / "package.json"
KEY = "copilotkit-test-key-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(
        os.environ.get("PARLEY_COPILOTKIT_TEST") != "1",
        reason="CopilotKit example skipped: opt-in (PARLEY_COPILOTKIT_TEST=1 after make copilotkit-example;"
        " ~800 MB of CopilotKit packages that make test and CI do not install)",
    ),
]


@pytest.fixture(scope="module", autouse=True)
def _example_installed() -> None:
    if not (VITE.is_file() and RUNTIME.is_file()) or shutil.which("node") is None:
        missing = "examples/copilotkit has no packages (make copilotkit-example) or node is missing"
        pytest.fail(f"PARLEY_COPILOTKIT_TEST=1, but {missing}")
    if not CHROMIUM.exists():
        pytest.fail(f"PARLEY_COPILOTKIT_TEST=1, but {CHROMIUM} is missing (make browser-deps, as root)")


def _listening(port: int, process: subprocess.Popen[bytes], log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)  # a port to poll: nothing announces it
    raise AssertionError(f"{log.stem} did not listen on {port}: {log.read_text()}")


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    """Starts a node process in the example's folder and waits for its port; stops them all at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(name: str, args: list[str], port: int, env: dict[str, str]) -> None:
        log = tmp_path / f"{name}.log"
        with log.open("w") as output:
            environment = {**os.environ, **env}
            process = subprocess.Popen(
                ["node", *args], cwd=EXAMPLE, env=environment, stdout=output, stderr=subprocess.STDOUT
            )
        started.append(process)
        _listening(port, process, log)

    yield start
    for process in started:
        process.terminate()
    for process in started:
        process.wait(timeout=10)


@pytest.fixture
def paced(database_url: str) -> Iterator[LiveServer]:
    """The demo model at its default pace: a `[long]` answer lasts long enough to reload the page in it. With
    a key, which only the runtime holds (PARLEY_API_KEY)."""
    with live_server(Settings(database_url=database_url, api_keys=f"copilotkit:{KEY}")) as server:
        yield server


@pytest.fixture
def page_url(paced: LiveServer, spawn: Any, tmp_path: Path) -> str:
    """CopilotKit's runtime on the live server, and the page built into tmp_path and served by `vite preview`,
    which forwards /api/copilotkit to the runtime and /v1, /ui to Parley."""
    dist = tmp_path / "dist"
    built = subprocess.run(
        ["node", str(VITE), "build", "--outDir", str(dist), "--emptyOutDir", "--logLevel", "error"],
        cwd=EXAMPLE,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    runtime, preview = free_port(), free_port()
    env = {"PORT": str(runtime), "PARLEY_URL": paced.base_url, "PARLEY_API_KEY": KEY}
    spawn("runtime", ["server.mjs"], runtime, env)
    spawn(
        "preview",
        [str(VITE), "preview", "--outDir", str(dist), "--port", str(preview), "--host", "127.0.0.1"],
        preview,
        {"PARLEY_URL": paced.base_url, "RUNTIME_URL": f"http://127.0.0.1:{runtime}"},
    )
    return f"http://127.0.0.1:{preview}/"


@pytest.fixture
def chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def _only_session(server: LiveServer) -> str:
    """The test's database is new, so the session Parley bound to CopilotKit's thread is its only one."""
    sessions = httpx.get(f"{server.base_url}/v1/sessions", headers=AUTH, timeout=10).json()["sessions"]
    assert len(sessions) == 1, sessions
    session_id: str = sessions[0]["id"]
    return session_id


def _history(server: LiveServer, session_id: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{server.base_url}/v1/sessions/{session_id}/messages", headers=AUTH, timeout=10)
    assert answer.status_code == 200, answer.text
    rows: list[dict[str, Any]] = answer.json()["chat_messages"]
    return rows


def _assistant_texts(page: Any) -> list[str]:
    texts: list[str] = page.eval_on_selector_all(
        ".copilotKitAssistantMessage", "rows => rows.map(r => r.textContent.trim())"
    )
    return texts


def _send(page: Any, text: str) -> None:
    field = page.locator(".copilotKitInput textarea")
    field.fill(text)
    field.press("Enter")


def test_copilot_chat_answers_shows_the_tool_and_survives_a_reload(
    chromium: Any, page_url: str, paced: LiveServer, tmp_path: Path
) -> None:
    page = chromium.new_context().new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    sent: list[str] = []
    page.on("request", lambda request: sent.append(json.dumps(request.headers) + (request.post_data or "")))
    with page.expect_response(lambda answer: answer.url.endswith("/agent/parley/connect")):
        page.goto(page_url)  # the chat sends once CopilotKit has connected to its runtime's agent
    try:
        _send(page, "what time is it?")
        page.wait_for_selector(".tool:has-text('current_time')", timeout=30_000)
        page.wait_for_selector(".copilotKitAssistantMessage:has-text('The current time is')", timeout=30_000)
        page.wait_for_selector(".tool:has-text('→')", timeout=10_000)  # the call with Parley's result

        # The same session on Parley's own routes: the question, the call with its result, the answer.
        session_id = _only_session(paced)
        rows = [r for r in _history(paced, session_id) if r["type"] in ("text", "tool_group")]
        assert [(r["type"], r["role"], r.get("tool_name")) for r in rows] == [
            ("text", "user", None),
            ("text", "assistant", None),
            ("tool_group", "assistant", "current_time"),
            ("text", "assistant", None),
        ]
        assert rows[0]["content"] == "what time is it?"
        assert rows[-1]["content"] in _assistant_texts(page)[-1]

        # A long answer, and a reload while it streams: CopilotKit connects to the thread again, and its
        # runtime replays the thread from its own memory (the runner's) and follows the answer to its end.
        page.wait_for_selector(".copilotKitInput textarea:not([disabled])")
        before = len(_assistant_texts(page))
        _send(page, "[long] tell me a story")
        page.wait_for_function(
            f"() => {{ const m = document.querySelectorAll('.copilotKitAssistantMessage');"
            f" return m.length > {before} && m[m.length - 1].textContent.length > 20; }}",
            timeout=30_000,
        )
        running = httpx.get(f"{paced.base_url}/v1/sessions/{session_id}", headers=AUTH, timeout=10).json()
        assert running["running_turn_id"] is not None  # ~400 tokens 20 ms apart: seconds to go
        page.reload()
        page.wait_for_selector(".copilotKitUserMessage:has-text('what time is it?')", timeout=30_000)
        stored = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = httpx.get(f"{paced.base_url}/v1/sessions/{session_id}", headers=AUTH, timeout=10).json()
            if state["running_turn_id"] is None:
                texts = [r for r in _history(paced, session_id) if r["type"] == "text"]
                stored = texts[-1]["content"].strip()
                break
            time.sleep(0.2)  # polling Parley's own route for the turn's end
        assert len(stored) > 200
        page.wait_for_function(
            "s => [...document.querySelectorAll('.copilotKitAssistantMessage')]"
            ".some(m => m.textContent.includes(s))",
            arg=stored[-80:],
            timeout=30_000,
        )
        assert _only_session(paced) == session_id
        assert not errors, errors
        assert sent and not [line for line in sent if KEY in line]  # the key stays on the runtime's side
    except Exception:
        page.screenshot(path=str(tmp_path / "copilotkit.png"))
        (tmp_path / "copilotkit.html").write_text(page.content())
        raise
