"""The reference page (/ui) in a real chromium against a real server process: a chat with the demo model,
Stop, kill -9 mid-answer, a second tab, a wrong key. Each scenario ends by comparing the rendered
conversation with GET .../messages, the server's own record, so a page that lost, doubled or reordered
text fails."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.browser.page import new_session, open_page, send, settled, transcript
from tests.support.process import ServerProcess

pytestmark = pytest.mark.slow

# `328ms · 14:30` or `1.2s · 14:30`: a finished tool group's meta.
TOOL_META = re.compile(r"^\d+(?:ms|\.\ds) · \d\d:\d\d$")


def test_chat_shows_the_streamed_answer_the_tool_group_and_the_context(
    browser: Any, parley: ServerProcess, shots: Path
) -> None:
    page = open_page(browser, parley.base_url)
    sid = new_session(page)
    send(page, "what time is it?")
    # while the turn runs: the status line and Stop (the input stays usable)
    page.wait_for_selector("#status-line:not([hidden])")
    assert page.is_enabled("#input")
    shown = settled(page, parley.base_url, sid)
    assert shown[0] == "user: what time is it?" and shown[-1].startswith("assistant: ")
    tool = page.locator(".message-row[data-kind=tool_group]")
    assert "current_time" in tool.inner_text()
    assert TOOL_META.match(tool.locator(".meta").inner_text()), tool.locator(".meta").inner_text()
    assert page.locator(".message-row[data-kind=assistant] .agent-name").first.inner_text() == "parley/demo"
    context = page.locator("#context")
    assert re.fullmatch(r"Context: \d+\.\d%", context.inner_text())
    assert context.get_attribute("class") == "ok"  # green under 50 %
    assert re.fullmatch(r"Session: [\d.]+K? tokens", page.inner_text("#session-tokens"))
    assert page.is_hidden("#stop") and page.inner_text("#connection") == "live"
    assert page.locator(f"#sessions li[data-id='{sid}']").count() == 1
    page.screenshot(path=str(shots / "chat.png"))


def test_stop_keeps_the_partial_answer_marked_interrupted(
    browser: Any, parley: ServerProcess, shots: Path
) -> None:
    page = open_page(browser, parley.base_url)
    sid = new_session(page)
    send(page, "[long] [slow] tell me a story")  # slow: Stop comes long before its end
    page.wait_for_function(
        "() => (document.querySelector('.message-row[data-kind=assistant] .message-bubble')"
        "?.textContent ?? '').length > 80"
    )
    assert page.is_visible("#stop")
    page.click("#stop")
    page.wait_for_selector(".message-row[data-kind=assistant] .interrupted-mark")
    shown = settled(page, parley.base_url, sid)
    assert len(shown) == 2 and len(shown[1]) < 1000  # cut well before the ~400 tokens
    assert page.inner_text(".turn-note") == "Turn cancelled"
    assert page.is_hidden("#stop")
    page.screenshot(path=str(shots / "stopped.png"))


def test_kill_9_mid_answer_the_page_reconnects_by_itself_with_nothing_lost_or_doubled(
    browser: Any, parley: ServerProcess, shots: Path
) -> None:
    page = open_page(browser, parley.base_url)
    sid = new_session(page)
    send(page, "what is 2+3*4?")
    settled(page, parley.base_url, sid)
    send(page, "[long] a long story")
    page.wait_for_function(  # well into the long answer, which is after the long message
        "() => { const rows = [...document.querySelectorAll('#messages .message-row')];"
        " const asked = rows.findIndex(r => r.textContent.includes('[long] a long story'));"
        " return asked >= 0 && rows.slice(asked + 1).some(r => r.dataset.kind === 'assistant'"
        " && r.textContent.includes('You said: [long] a long story') && r.textContent.length > 150); }"
    )
    parley.kill()
    page.wait_for_selector("#connection[data-status='reconnecting']")
    parley.start(timeout=90)
    page.wait_for_selector("#connection[data-status='open']", timeout=60_000)
    shown = settled(page, parley.base_url, sid)
    assert shown[0] == "user: what is 2+3*4?" and shown[-2] == "user: [long] a long story"
    assert shown[-1].startswith("assistant: You said: [long] a long story")  # the part that streamed before
    assert page.inner_text(".turn-note") == "Turn interrupted"  # closed at the restart
    page.screenshot(path=str(shots / "after-restart.png"))


def test_a_second_tab_shows_the_same_conversation_live(browser: Any, parley: ServerProcess) -> None:
    first = open_page(browser, parley.base_url)
    sid = new_session(first)
    second = open_page(browser, parley.base_url, session_id=sid)
    send(first, "what time is it?")
    # the second tab sees the answer stream in, not only at the end
    second.wait_for_selector("#status-line:not([hidden])")
    shown = settled(second, parley.base_url, sid)
    assert transcript(first) == shown
    assert second.locator(".message-row[data-kind=tool_group]").count() == 1
    # a message sent while the agent works shows as queued, in both tabs, until a turn takes it
    send(second, "[long] a long one")
    first.wait_for_selector("#stop:not([hidden])")
    send(first, "and then?")
    for page in (first, second):
        queued = page.locator(".message-row.queued")
        queued.wait_for()
        assert "and then?" in queued.inner_text() and "queued" in queued.inner_text()
    shown = settled(first, parley.base_url, sid)
    assert shown[-2] == "user: and then?" and shown[-1].startswith("assistant: You said: and then?")
    assert settled(second, parley.base_url, sid) == shown
    assert first.locator(".message-row.queued").count() == second.locator(".message-row.queued").count() == 0


def test_a_wrong_key_shows_a_clear_error(browser: Any, parley: ServerProcess, shots: Path) -> None:
    good = open_page(browser, parley.base_url)
    sid = new_session(good)
    page = open_page(browser, parley.base_url, key="not-the-key-0000000000")
    error = page.locator("#error")
    error.wait_for()
    assert "The API key was refused (401 unauthorized)" in error.inner_text()
    # a session opened with the wrong key says why instead of going silent
    page.evaluate("id => { location.hash = id }", sid)
    page.wait_for_selector("#connection[data-status='closed']")
    assert "401" in page.inner_text("#connection")
    assert "The API key was refused" in error.inner_text()
    page.screenshot(path=str(shots / "wrong-key.png"))
