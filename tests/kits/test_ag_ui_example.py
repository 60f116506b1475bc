"""examples/ag-ui against a live server with the demo model: the page's own code (src/parley.js,
AG-UI's HttpAgent) driven from Node, and the built page itself in Debian's chromium behind vite's
preview server, which forwards /v1 to Parley as it does in development. Both chat, show the tool call,
and leave the same session on Parley's own routes; a reloaded page attaches to its thread again.

Without examples/ag-ui/node_modules (`make examples`) the module is skipped with one line;
under CI=true that is a failure."""

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
from tests.support.missing import missing
from tests.support.server import LiveServer, free_port, live_server

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ag-ui"
VITE = EXAMPLE / "node_modules" / "vite" / "bin" / "vite.js"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _example_installed() -> None:
    if not VITE.is_file() or shutil.which("node") is None:
        missing("example tests skipped: examples/ag-ui/node_modules is missing (make examples)")


def history(server: LiveServer, session_id: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{server.base_url}/v1/sessions/{session_id}/messages", timeout=10)
    assert answer.status_code == 200, answer.text
    rows: list[dict[str, Any]] = answer.json()["chat_messages"]
    return rows


def assert_one_chat(rows: list[dict[str, Any]], question: str) -> None:
    """The turn as Parley stored it: the question, the current_time call with its result, the answer."""
    said = [r for r in rows if r["type"] in ("text", "tool_group")]
    kinds = [(r["type"], r["role"], r.get("tool_name")) for r in said]
    assert kinds == [
        ("text", "user", None),
        ("text", "assistant", None),
        ("tool_group", "assistant", "current_time"),
        ("text", "assistant", None),
    ], kinds
    assert said[0]["content"] == question
    assert said[-1]["content"].startswith("The current time is")
    assert [r["status"] for r in rows if r["type"] == "turn_done"] == ["completed"]


def test_a_chat_through_the_examples_code(server: LiveServer) -> None:
    done = subprocess.run(
        ["node", "scripts/chat.mjs", server.base_url, "what time is it?"],
        cwd=EXAMPLE,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["types"][0] == "RUN_STARTED" and seen["types"][-1] == "RUN_FINISHED"
    assert {"TEXT_MESSAGE_CONTENT", "TOOL_CALL_START", "TOOL_CALL_RESULT"} <= set(seen["types"])
    user, called, result, answer = seen["messages"]
    assert called["toolCalls"][0]["function"]["name"] == "current_time"
    assert result["role"] == "tool" and '"timezone": "UTC"' in result["content"]
    assert answer["content"].startswith("The current time is")
    # The same session on Parley's own routes, and the same conversation for a page that reloads.
    rows = history(server, seen["sessionId"])
    assert_one_chat(rows, "what time is it?")
    assert rows[1]["client_message_id"] == user["id"]  # after the turn's start
    assert seen["reloaded"] == seen["messages"]


# --- the page in chromium -------------------------------------------------------------------------------


def _listening(port: int, process: subprocess.Popen[bytes], log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)  # a port to poll: nothing announces it
    raise AssertionError(f"vite preview did not listen on {port}")


@pytest.fixture
def paced(database_url: str) -> Iterator[LiveServer]:
    """The demo model at its default pace: a `[long]` answer lasts long enough to reload the page in it."""
    with live_server(Settings(database_url=database_url)) as server:
        yield server


@pytest.fixture
def page_url(paced: LiveServer, tmp_path: Path) -> Iterator[str]:
    """The page built into tmp_path and served by `vite preview`, which forwards /v1 to the live server."""
    dist = tmp_path / "dist"
    built = subprocess.run(
        ["node", str(VITE), "build", "--outDir", str(dist), "--emptyOutDir", "--logLevel", "warn"],
        cwd=EXAMPLE,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    port = free_port()
    log = tmp_path / "preview.log"
    with log.open("w") as output:
        preview = subprocess.Popen(
            ["node", str(VITE), "preview", "--outDir", str(dist), "--port", str(port), "--host", "127.0.0.1"],
            cwd=EXAMPLE,
            env={**os.environ, "PARLEY_URL": paced.base_url},
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        try:
            _listening(port, preview, log)
            yield f"http://127.0.0.1:{port}/"
        finally:
            preview.terminate()
            preview.wait(timeout=10)


@pytest.fixture
def chromium() -> Iterator[Any]:
    if not CHROMIUM.exists():
        missing(f"browser test skipped: {CHROMIUM} is missing (make browser-deps installs it as root)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def _transcript(page: Any) -> list[str]:
    texts: list[str] = page.eval_on_selector_all(".msg", "rows => rows.map(r => r.textContent)")
    return texts


@pytest.mark.browser
def test_the_page_chats_shows_the_tool_and_survives_a_reload_mid_answer(
    chromium: Any, page_url: str, paced: LiveServer
) -> None:
    page = chromium.new_context().new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(page_url)
    field = page.locator("input")
    field.fill("what time is it?")
    field.press("Enter")
    page.wait_for_selector(".tool:has-text('→')", timeout=30_000)
    page.wait_for_selector(".msg.assistant:has-text('The current time is')", timeout=30_000)
    link = page.locator("a[href^='/ui#']")
    session_id = link.inner_text()
    assert_one_chat(history(paced, session_id), "what time is it?")
    first = _transcript(page)
    assert first[0] == "what time is it?" and "current_time(" in first[1]

    # A long answer, and a reload while it streams: the page attaches to its thread again, gets the
    # history and the running answer from its start, and follows it to its end.
    page.wait_for_selector("input:not([disabled])")
    field.fill("[long] tell me a story")
    field.press("Enter")
    page.wait_for_function(
        "() => document.querySelectorAll('.msg.assistant').length >= 3"
        " && document.querySelectorAll('.msg.assistant')[2].textContent.length > 20",
        timeout=30_000,
    )
    running = httpx.get(f"{paced.base_url}/v1/sessions/{session_id}", timeout=10).json()
    assert running["running_turn_id"] is not None  # ~400 tokens 20 ms apart: seconds to go
    page.reload()
    page.wait_for_selector("input:not([disabled])", timeout=60_000)
    after = _transcript(page)
    assert after[: len(first)] == first
    stored = [r for r in history(paced, session_id) if r["type"] == "text" and r["role"] == "assistant"]
    assert after[-1] == stored[-1]["content"] and len(after[-1]) > 200
    assert page.locator("a[href^='/ui#']").inner_text() == session_id
    assert errors == []
