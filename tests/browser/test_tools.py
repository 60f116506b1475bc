"""The page's tools in a real chromium against a real server process: the demo client tool the page declares
and answers by itself, and approval cards (edit with a check before sending, approve, reject with a reason).
Each scenario ends by comparing what the page shows with GET .../messages, the server's own record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.browser.page import history_rows, new_session, open_page, pending, posts_to, send, settled
from tests.support.process import ServerProcess

pytestmark = pytest.mark.slow


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

    card.locator("textarea").fill('{"expression": "6*7"')
    card.locator("button.approve").click()
    assert "Not valid JSON" in card.locator(".approval-error").inner_text()
    page.wait_for_timeout(300)  # a request the click sent would be on its way by now
    assert decisions == []
    assert [p["name"] for p in pending(parley.base_url, sid)] == ["calculate"]

    card.locator("textarea").fill('{"expression": "6*7"}')
    card.locator("button.approve").click()
    card.wait_for(state="detached")
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
