"""The reference page (/ui) in a real chromium against a real server process: a chat with the demo model,
Stop, kill -9 mid-answer, a second tab, a wrong key, the demo client tool the page declares and answers by
itself, and approval cards (edit with a check before sending, approve, reject with a reason). Each
scenario ends by comparing the rendered conversation with GET .../messages, the server's own record, so a
page that lost, doubled or reordered text fails."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.browser.page import (
    history_rows,
    new_session,
    open_page,
    pending,
    posts_to,
    send,
    settled,
    transcript,
)
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


def test_the_page_answers_its_client_tool_by_itself(browser: Any, parley: ServerProcess) -> None:
    """The model calls get_browser_time; the page runs it and posts the result once, and the turn completes
    with that result in the tool group. A result posted twice, or never, or a page that shows something the
    server did not store, fails the comparison with the history."""
    page = open_page(browser, parley.base_url)
    results = posts_to(page, "/tool_results")
    sid = new_session(page)
    send(page, "[call:get_browser_time {}] where is this browser?")
    shown = settled(page, parley.base_url, sid)
    assert shown[0] == "user: [call:get_browser_time {}] where is this browser?"
    assert shown[-1].startswith("assistant: The get_browser_time tool returned: ")
    [row] = history_rows(parley.base_url, sid, "tool_group")
    assert (row["tool_name"], row["executed_by"], row["is_error"]) == ("get_browser_time", "client", False)
    answer = json.loads(row["result"])
    assert set(answer) == {"time", "time_zone", "language", "utc"}
    assert answer["time"] in shown[-1]
    tool = page.locator(".message-row[data-kind=tool_group]")
    assert "get_browser_time ✓" in tool.locator("summary").inner_text()
    assert json.loads(tool.locator(".tool-result").text_content() or "") == answer
    assert len(results) == 1


def test_approval_cards_edit_approve_and_reject_with_a_reason(
    browser: Any, parley: ServerProcess, shots: Path
) -> None:
    """An approval card waits for the person: edited arguments that are not JSON show an error and send
    nothing (the call still waits on the server); fixed ones run the tool with them. A second card rejected
    with a reason gives the model that reason. The history holds exactly what the page shows."""
    page = open_page(browser, parley.base_url)
    decisions = posts_to(page, "/approvals")
    page.check("#ask-approval")
    sid = new_session(page)
    send(page, "what is 2+3*4?")
    card = page.locator(".approval-card")
    card.wait_for()
    assert "Run calculate?" in card.inner_text()
    assert json.loads(card.locator("textarea").input_value()) == {"expression": "2+3*4"}
    assert page.inner_text("#status-line") == "waiting for your answer…" and page.is_visible("#stop")
    page.screenshot(path=str(shots / "approval.png"))
    # a page opened now (or reloaded) shows the card too: the request is older than the history it reads
    other = open_page(browser, parley.base_url, session_id=sid)
    other.locator(".approval-card").wait_for()

    card.locator("textarea").fill('{"expression": "6*7"')
    card.locator("button.approve").click()
    assert "Not valid JSON" in card.locator(".approval-error").inner_text()
    page.wait_for_timeout(300)  # a request the click sent would be on its way by now
    assert decisions == []
    assert [p["name"] for p in pending(parley.base_url, sid)] == ["calculate"]

    card.locator("textarea").fill('{"expression": "6*7"}')
    card.locator("button.approve").click()
    card.wait_for(state="detached")
    other.locator(".approval-card").wait_for(state="detached")  # answered: gone in every tab
    shown = settled(page, parley.base_url, sid)
    assert shown[0] == "user: what is 2+3*4?" and shown[-1] == "assistant: The result is 42."
    [row] = history_rows(parley.base_url, sid, "tool_group")
    assert (row["decision"], row["arguments"], row["result"]) == ("edit", {"expression": "6*7"}, "42")
    group = page.locator(".message-row[data-kind=tool_group]")
    assert "approved with edits" in group.locator("summary").inner_text()
    assert json.loads(group.locator(".tool-args").text_content() or "") == {"expression": "6*7"}

    send(page, "what is 1+1?")
    card.wait_for()
    card.locator(".approval-reason").fill("not with these numbers")
    card.locator("button.reject").click()
    card.wait_for(state="detached")
    shown = settled(page, parley.base_url, sid)
    assert shown[-1] == (
        "assistant: You rejected the calculate call (your reason: not with these numbers),"
        " so I did not run it."
    )
    rejected = history_rows(parley.base_url, sid, "tool_group")[-1]
    assert (rejected["decision"], rejected["is_error"]) == ("reject", True)
    assert "rejected: not with these numbers" in group.last.locator("summary").inner_text()
    sent = [json.loads(d.post_data or "")["decisions"] for d in decisions]
    assert [[d["decision"] for d in each] for each in sent] == [["edit"], ["reject"]]
